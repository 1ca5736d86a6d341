"""Which function answers how: its settings loader and its `explain` (functions/<name>/explain.py), by name."""
from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from shared.runtime import KubeContext

Explainer = Callable[[KubeContext[Any], str, str], Any]


def _package(function: str) -> str:
    return function.replace("-", "_")


def settings_loader(function: str) -> Callable[[Mapping[str, str]], Any]:
    loader: Callable[[Mapping[str, str]], Any] = importlib.import_module(
        f"functions.{_package(function)}.settings").load
    return loader


def explainer(function: str) -> Explainer:
    """(ctx, namespace, name) → cli.explain.Answer, from the function's own explain()."""
    from cli.explain import Answer

    module = importlib.import_module(f"functions.{_package(function)}.explain")

    def answer(ctx: KubeContext[Any], namespace: str, name: str) -> Answer:
        verdict, reason, lines = module.explain(ctx, namespace, name)
        return Answer(function, verdict, reason, list(lines))
    return answer
