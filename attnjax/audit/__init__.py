"""The claims audit: the seed articles' claims (docs/CLAIMS_AUDIT.md) as experiments with
verdict functions (``experiments/claims/<group>/<ID>.py``), run by ``attnjax audit``."""

from attnjax.audit.claims import ClaimFile, Runs, Trained, load_claim, load_claims
from attnjax.audit.verdict import Verdict, holds, over_regimes, over_seeds, untestable

__all__ = ["ClaimFile", "Runs", "Trained", "Verdict", "holds", "load_claim", "load_claims",
           "over_regimes", "over_seeds", "untestable"]
