"""`python -m cloudtrain.providers.local stop|terminate --base DIR INSTANCE_ID`: what the on-node
watchdog of a local cluster runs to stop or delete its node (LocalProvider.watchdog_action); the
same as `cloudtrain stop` / `down` do to the node, without touching state (`status --refresh`
reconciles it)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cloudtrain.providers.local import LocalProvider


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cloudtrain.providers.local", description=__doc__)
    parser.add_argument("verb", choices=["stop", "terminate"])
    parser.add_argument("--base", required=True, help="the local provider's node directory")
    parser.add_argument("instance_id")
    args = parser.parse_args(argv)
    provider = LocalProvider(Path(args.base))
    if args.verb == "stop":
        provider.stop([args.instance_id])
    else:
        provider.terminate([args.instance_id])
    print(f"{args.verb}: {args.instance_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
