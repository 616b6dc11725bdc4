"""Store the target fingerprint in the shipped drafters' headers (checkpoints/*/drafter.json).

The shipped drafters were trained before drafter.json recorded the target's weights fingerprint
(specjax.train.checkpoint.target_fingerprint); each was trained on exactly the reference target
below, so its fingerprint is computed from that file and added to the header (the other fields and
the params/ checkpoint are left as they are). Drafters trained since store it themselves.

    python experiments/fingerprint_drafters.py            # add / refresh all four
    python experiments/fingerprint_drafters.py --check    # only compare, exit 1 on a difference
"""

from __future__ import annotations

import argparse
import sys

import specjax
from specjax.paths import (
    SMOLLM2,
    SMOLLM2_EAGLE,
    SMOLLM2_MDC,
    STORIES260K,
    STORIES260K_EAGLE,
    STORIES260K_MDC,
    repo_dir,
    shared_path,
)
from specjax.train.checkpoint import add_fingerprint, read_header, target_fingerprint

# target (under $SPECJAX_SHARED) -> the shipped drafters trained for it
SHIPPED = {
    SMOLLM2: (SMOLLM2_MDC, SMOLLM2_EAGLE),
    STORIES260K: (STORIES260K_MDC, STORIES260K_EAGLE),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare only, write nothing")
    args = parser.parse_args()
    differ = 0
    for target_path, drafters in SHIPPED.items():
        model = specjax.load(shared_path(target_path)).model
        fingerprint = target_fingerprint(model)
        for name in drafters:
            path = repo_dir() / name
            stored = read_header(path).get("target_fingerprint")
            if args.check:
                ok = stored == fingerprint
                differ += not ok
                print(f"{name}: {'ok' if ok else f'stored {stored}, target {fingerprint}'}")
            else:
                add_fingerprint(path, model)
                print(f"{name}: {fingerprint} ({target_path})")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
