"""``apply_match``: the one way the search rewrites a module — prove the match on its region first
(``check``), apply the rule, and make sure main's signature is unchanged."""
from __future__ import annotations

import tvm

from .base import Match, Rule, rule_of
from .check import check_match
from .graph import SubstitutionError, output_signature

__all__ = ["apply_match"]


def apply_match(mod: tvm.IRModule, match: Match, check: bool = True, *, rule: Rule | None = None) -> tvm.IRModule:
    """Apply ``match``; main's signature and result types must be unchanged. With ``check``, first prove the
    rewrite numerically on the matched region (:func:`check_match`, cached by structure).

    ``rule`` (an addition to the interface) applies an unregistered Rule object, e.g. one made in a test.
    """
    r = rule if rule is not None else rule_of(match)
    where = f"{r.name} on {list(match.nodes)}"
    if check:
        check_match(mod, match, rule=r)
    try:
        new = r.apply(mod, match)
    except SubstitutionError:
        raise
    except Exception as err:  # a TVM error while building the replacement
        raise SubstitutionError(f"{where}: the rewrite failed: {type(err).__name__}: {err}") from err
    before, after = output_signature(mod), output_signature(new)
    if before != after:
        raise SubstitutionError(f"{where}: main's result changed from {before} to {after}")
    old_p = [(p.name, str(p.ty)) for p in mod["main"].params]
    new_p = [(p.name, str(p.ty)) for p in new["main"].params]
    if old_p != new_p:
        raise SubstitutionError(f"{where}: main's parameters changed")
    return new
