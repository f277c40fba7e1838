"""The substitution interface: :class:`Match`, :class:`Rule`, the registry :data:`RULES` and
:func:`find_matches` (:func:`apply_match` lives in ``apply``, above the numeric check).

A rule is found and applied by *name*: a :class:`Match` holds only names of main's bindings (plus hashable
``params``), so the search can keep, hash and compare matches across modules. ``apply`` re-derives
everything from the module, and re-checks legality (``match`` must be among ``find(mod, within=match.nodes)``),
so a stale or hand-made match cannot produce a wrong module.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import tvm

from .graph import DataflowGraph, SubstitutionError

__all__ = ["RULES", "Match", "Rule", "find_matches", "register", "rule_of"]


@dataclass(frozen=True)
class Match:
    """One place a rule applies: ``nodes`` are the bindings the rewrite consumes, in program order."""

    rule: str
    nodes: tuple[str, ...]
    params: tuple = ()

    @property
    def key(self) -> str:
        """A stable string identifying the match (rule, nodes, params)."""
        extra = f"|{','.join(map(str, self.params))}" if self.params else ""
        return f"{self.rule}:{','.join(self.nodes)}{extra}"


class Rule(ABC):
    """A graph substitution. Subclasses set the class attributes and implement :meth:`matches` (legality)
    and :meth:`rewrite` (the replacement); :meth:`find` / :meth:`apply` are what callers use."""

    name: str = ""
    operators: tuple[str, ...] = ()
    legality: str = ""
    inverse_of: str | None = None

    # ---- to implement ------------------------------------------------------------------------------
    @abstractmethod
    def matches(self, g: DataflowGraph, allowed: set[str] | None) -> list[Match]:
        """All legal matches of this rule whose nodes lie in ``allowed`` (every binding when None)."""

    @abstractmethod
    def rewrite(self, g: DataflowGraph, match: Match) -> tvm.IRModule:
        """The rewritten module for a match already known to be legal."""

    # ---- the interface -------------------------------------------------------------------------------
    def find(self, mod: tvm.IRModule, within: set[str] | None = None) -> list[Match]:
        """All matches (sorted by key) whose nodes all lie in ``within`` when given."""
        g = DataflowGraph(mod)
        allowed = set(within) if within is not None else None
        found = self.matches(g, allowed)
        if allowed is not None:
            found = [m for m in found if set(m.nodes) <= allowed]
        found = [m for m in found if g.is_convex(set(m.nodes))]
        return sorted(set(found), key=lambda m: (g.index[m.nodes[0]], m.key))

    def apply(self, mod: tvm.IRModule, match: Match) -> tvm.IRModule:
        """The rewritten module. Raises SubstitutionError when the match is not (or no longer) legal."""
        if match.rule != self.name:
            raise SubstitutionError(f"{self.name}: given a match of rule {match.rule!r}")
        if match not in self.find(mod, within=set(match.nodes)):
            raise SubstitutionError(f"{self.name}: {list(match.nodes)} (params {match.params}) is not a legal "
                                    "match in this module")
        return self.rewrite(DataflowGraph(mod), match)

    def __repr__(self) -> str:
        return f"<Rule {self.name}>"


#: every rule by name (filled by the rule modules on import of the package)
RULES: dict[str, Rule] = {}


def register(rule_cls: type[Rule]) -> type[Rule]:
    """Class decorator: instantiate and register a rule under its name."""
    rule = rule_cls()
    if not rule.name or rule.name in RULES:
        raise ValueError(f"rule name {rule.name!r} missing or registered twice")
    RULES[rule.name] = rule
    return rule_cls


def _rules(rules: Iterable[str | Rule] | None) -> list[Rule]:
    if rules is None:
        return list(RULES.values())
    out = []
    for r in rules:
        if isinstance(r, Rule):
            out.append(r)
        elif r in RULES:
            out.append(RULES[r])
        else:
            raise SubstitutionError(f"unknown rule {r!r} (known: {sorted(RULES)})")
    return out


def find_matches(mod: tvm.IRModule, rules: Sequence[str | Rule] | None = None,
                 within: set[str] | None = None) -> list[Match]:
    """The matches of ``rules`` (names or Rule objects; all registered rules when None) in ``mod``."""
    out: list[Match] = []
    for rule in _rules(rules):
        out.extend(rule.find(mod, within))
    return out


def rule_of(match: Match) -> Rule:
    if match.rule not in RULES:
        raise SubstitutionError(f"unknown rule {match.rule!r} in match {match.key}")
    return RULES[match.rule]
