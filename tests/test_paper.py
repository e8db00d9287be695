"Properties of depthnb.paper beyond the notebook's examples: the transcriptions read back as printed."
from depthnb.paper import petty_table3_paper


def test_petty_table3_is_the_papers():
    p = petty_table3_paper().set_index(["size_class", "n_layers"])
    assert p.loc[("41M", 5), "passivization"] == 89.9
    assert p.loc[("134M", 32), "ppl"] == 19.2
    assert p.loc[("374M", 1), "cogs_vf"] == 36.8
    assert sorted(p.loc["134M"].index) == [1, 2, 4, 6, 8, 12, 16, 21, 26, 32]
