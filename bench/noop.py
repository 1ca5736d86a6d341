"""The benchmark's baseline: a functions-framework `http` target that does nothing.

It runs in the same functions-framework / gunicorn / Flask stack as the functions, so
"vmi-cleanup ÷ no-op" measures what vmi-cleanup adds, not what the stack costs.
"""
import flask


def handle(request: flask.Request) -> flask.Response:
    return flask.Response(status=204)
