"""Packages found, not listed: the plugins/ folder installs as `testbed_plugins` (`plugins`
is too generic an import name), which pyproject.toml's package finder cannot rename."""

from setuptools import find_packages, setup

setup(
    packages=[
        *find_packages(include=["testbed", "testbed.*"]),
        *(f"testbed_{name}" for name in find_packages(include=["plugins", "plugins.*"])),
    ],
    package_dir={"testbed_plugins": "plugins"},
    package_data={"testbed.report": ["results.schema.json", "launch.schema.json"]},
)
