"""`python -m image build|base|layers`: make image, the Debian-packaged base alone, or what the image holds."""
from __future__ import annotations

import argparse
import sys

from image import base, build, engine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m image")
    parser.add_argument("what", choices=("build", "base", "layers"))
    parser.add_argument("--tag", default=None, help=f"the image's tag (default: $IMAGE or {build.DEFAULT_TAG})")
    parser.add_argument("--python-image", default=None,
                        help="the Dockerfile's PYTHON_IMAGE (default: $PYTHON_IMAGE, else the Debian-packaged base)")
    args = parser.parse_args(argv)
    say = lambda text: print(f"image: {text}", file=sys.stderr, flush=True)  # noqa: E731
    try:
        found = engine.require()
        if args.what == "base":
            print(base.ensure(found, say))
            return 0
        tag = args.tag or build.default_tag()
        if args.what == "build":
            build.build(found, tag, args.python_image, say)
        rows = build.layers(found, tag)
        for layer in rows:
            print(f"{layer.size / 2**20:8.1f} MiB  {layer.created_by[:110]}")
        print(f"{build.size(found, tag) / 2**20:8.1f} MiB  {tag} ({len(rows)} layers)")
    except engine.EngineError as exc:
        print(f"make image: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
