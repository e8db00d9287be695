# The nbdev 2 setup script: every setting lives in settings.ini.
from configparser import ConfigParser

import setuptools

config = ConfigParser(delimiters=["="])
config.read("settings.ini", encoding="utf-8")
cfg = config["DEFAULT"]

licenses = {"apache2": ("Apache Software License 2.0", "OSI Approved :: Apache Software License")}
statuses = ["1 - Planning", "2 - Pre-Alpha", "3 - Alpha", "4 - Beta", "5 - Production/Stable"]
py_versions = "3.11 3.12 3.13".split()
min_python = cfg["min_python"]
lic = licenses[cfg["license"]]

setuptools.setup(
    name=cfg["lib_name"],
    license=lic[0],
    classifiers=[
        "Development Status :: " + statuses[int(cfg["status"]) - 1],
        "Intended Audience :: " + cfg["audience"].title(),
        "License :: " + lic[1],
        "Natural Language :: " + cfg["language"].title(),
    ]
    + ["Programming Language :: Python :: " + o for o in py_versions[py_versions.index(min_python):]],
    url=cfg["git_url"],
    packages=setuptools.find_packages(include=["depthnb", "depthnb.*"]),
    include_package_data=True,
    package_data={"depthnb": ["lm_eval_tasks/*.yaml"]},  # depthnb's lm-eval task files (--include_path)
    install_requires=cfg.get("requirements", "").split(),
    extras_require={"dev": cfg.get("dev_requirements", "").split() + cfg.get("hf_requirements", "").split(),
                    "hf": cfg.get("hf_requirements", "").split(),
                    "gpu": cfg.get("gpu_requirements", "").split()},
    dependency_links=cfg.get("dep_links", "").split(),
    python_requires=">=" + cfg["min_python"],
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    zip_safe=False,
    entry_points={
        "console_scripts": cfg.get("console_scripts", "").split(),
        "nbdev": [f'{cfg.get("lib_path")}={cfg.get("lib_path")}._modidx:d'],
    },
    version=cfg["version"],
    author=cfg["author"],
    author_email=cfg["author_email"],
    description=cfg["description"],
    keywords=cfg["keywords"],
)
