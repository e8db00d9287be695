"""Every prompt cut to fit the context is counted in the downstream tables: the per-result `truncated` counts summed
per method in Tables 1, 2 and 3-5 of ours (the paper's rows have none), unknown (NA) where a result predates the count."""
import pandas as pd

from depthnb.downstream_tasks import DOWNSTREAM_TASKS
from depthnb.paper import GROUP_TASKS
from depthnb.downstream_tables import downstream_table1, downstream_table2, downstream_task_table, truncated_count


def _rows(method, group, tasks, calc, cut):
    return [dict(method=method, task=t, title=DOWNSTREAM_TASKS[t].title, group=group, calculator=calc, n=10,
                 accuracy=0.1, truncated=cut, missing=None, val_loss=2.0) for t in tasks]


def _results():
    rows = []
    for method, cut in (("baseline", 1), ("midas", 2)):
        rows += _rows(method, "math", GROUP_TASKS["math"], True, cut) + _rows(method, "math", GROUP_TASKS["math"], False, 10 * cut)
        rows += _rows(method, "gsm8k", ["gsm8k"], True, 100 * cut) + _rows(method, "gsm8k", ["gsm8k"], False, 100 * cut)
        rows += _rows(method, "closed_book_qa", ["nq_open", "webqs"], False, 0)
    out = pd.DataFrame(rows)
    return out.assign(truncated=out.truncated.astype("Int64"))


def test_tables_sum_the_requests_cut_per_method():
    r = _results()
    n_math = len(GROUP_TASKS["math"])
    t1 = downstream_table1(r, "demo").set_index(["source", "method"]).truncated
    assert t1[("ours", "baseline")] == n_math * 1 and t1[("ours", "midas")] == n_math * 2  # Table 1: with the calculator
    assert t1["paper"].isna().all()
    t5 = downstream_task_table(r, 5, "demo").set_index(["source", "method"]).truncated
    assert t5[("ours", "midas")] == n_math * 2
    t2 = downstream_table2(r, "demo").set_index(["source", "method"]).truncated  # both settings, math and GSM8k
    assert t2[("ours", "baseline")] == n_math * (1 + 10) + 200 and t2[("ours", "midas")] == n_math * (2 + 20) + 400


def test_a_result_without_a_count_leaves_the_sum_unknown():
    r = _results()
    r.loc[(r.method == "midas") & (r.task == "svamp") & r.calculator, "truncated"] = pd.NA
    counts = truncated_count(r[r.group == "math"])
    assert pd.isna(counts["midas"]) and counts["baseline"] == len(GROUP_TASKS["math"]) * 11
    assert truncated_count(r.drop(columns="truncated")).isna().all()  # frames from before the column
