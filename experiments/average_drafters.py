"""Average the weights of trained drafters of one lineage (specjax.train.averaging) into a new
drafter directory, stored in the dtype of the last one.

    python experiments/average_drafters.py --out runs/eagle_soup/smollm2-eagle \\
        runs/eagle_clean_self1000/smollm2-eagle runs/eagle_clean_self1500b/smollm2-eagle

The result has no acceptance profile or pre-verifier (they belong to other weights): measure it
with experiments/drafter_tau.py, and before shipping it run experiments/calibrate_drafters.py
and experiments/train_pre_verifier.py on it.
"""

from __future__ import annotations

import argparse
import sys

from specjax.train.averaging import average_drafters
from specjax.train.checkpoint import save_drafter


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("drafters", nargs="+", help="drafter directories (at least two)")
    ap.add_argument("--out", required=True, help="the new drafter directory")
    args = ap.parse_args(argv)
    try:
        net, header = average_drafters(args.drafters)
    except ValueError as e:
        ap.error(str(e))
    out = save_drafter(
        net,
        args.out,
        target_name=header.get("target_name", ""),
        dtype=header["dtype"],
        fingerprint=header.get("target_fingerprint"),
    )
    print(f"wrote {out}: the mean of {len(args.drafters)} drafters' weights")
    return 0


if __name__ == "__main__":
    sys.exit(main())
