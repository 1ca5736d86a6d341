"""The `vmevents` command (an operator's): `explain` one VM, `check` the functions' settings, install the `knative`
that fits the cluster. Installed with the package as a console script; `python -m cli` runs it from a checkout."""
