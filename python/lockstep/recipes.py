"""Precision recipes (docs/recipes.md): the built-in registry, recipe files and JSON, the library's
selection precedence, and describe (the resolved format of every GEMM of every layer)."""
from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

from . import _lockstep


class Recipe:
    """A precision recipe: per module class, the format of each operand of fprop, dgrad and
    wgrad, the backward mode and the coverage rules."""

    __slots__ = ("_r", "provenance")

    def __init__(self, handle: "_lockstep.Recipe", provenance: Optional[Dict[str, Any]] = None):
        self._r = handle
        self.provenance = provenance or {"source": "code"}

    @staticmethod
    def from_name(name: str) -> "Recipe":
        """A built-in recipe (`lockstep.recipes()` lists them); unknown names raise RecipeError
        with the closest names."""
        return Recipe(_lockstep.Recipe.from_name(name), {"source": "code", "detail": name})

    @staticmethod
    def from_file(path: str) -> "Recipe":
        """A recipe file (the built-ins' JSON schema; "extends" names a built-in)."""
        return Recipe(_lockstep.Recipe.from_file(str(path)), {"source": "file", "detail": str(path)})

    @staticmethod
    def from_dict(d: Dict[str, Any], name: str = "custom") -> "Recipe":
        """A recipe from a dict in the file schema."""
        return Recipe(_lockstep.Recipe.from_json_text(json.dumps(d), "<dict>", name),
                      {"source": "code"})

    @staticmethod
    def select(name: Optional[str] = None, file: Optional[str] = None) -> "Recipe":
        """By the library's precedence: file > name > $LOCKSTEP_RECIPE > bf16, with
        DISABLE_BACKWARD_QUANT=1 applied; .provenance says where each choice came from."""
        r, prov = _lockstep.Recipe.select(name, None if file is None else str(file))
        return Recipe(r, json.loads(prov))

    @property
    def name(self) -> str:
        return self._r.name

    @property
    def purpose(self) -> str:
        return self._r.purpose

    @property
    def handle(self) -> "_lockstep.Recipe":
        return self._r

    def to_dict(self) -> Dict[str, Any]:
        """The full, flattened recipe in the file schema."""
        return json.loads(self._r.to_json_text())

    def describe(self, layers: int = 48, explain: bool = False) -> Dict[str, Any]:
        """`lockstep describe --json`: per layer and module class, the format of fprop, dgrad and
        wgrad and the backward mode (plus the deciding rule with explain)."""
        return json.loads(self._r.describe_json_text(layers, explain))

    def module_spec(self, module_class: Optional[str] = None, layer: int = -1,
                    layers: int = 1) -> Dict[str, Any]:
        """The spec a module runs with: the recipe's spec for quantized modules (no class), the
        spec of a class, or with layer >= 0 the coverage rules' choice for that layer."""
        return json.loads(self._r.module_spec_json_text(module_class or "", layer, layers))

    def requirements(self) -> List[str]:
        return list(self._r.requirements())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Recipe) and self._r == other._r

    def __repr__(self) -> str:
        return f"lockstep.Recipe({self.name!r})"


def recipes() -> List[Dict[str, Any]]:
    """Every built-in recipe as `lockstep recipes --json` lists it: name, purpose, forward,
    backward, coverage, requires, and the full recipe."""
    return json.loads(_lockstep.recipes_json_text())


def as_recipe(r: Any) -> Recipe:
    """A Recipe from a Recipe, a built-in name, or None (the selection precedence)."""
    if isinstance(r, Recipe):
        return r
    if r is None:
        return Recipe.select()
    if isinstance(r, str):
        return Recipe.from_name(r)
    if isinstance(r, dict):
        return Recipe.from_dict(r)
    raise _lockstep.Error(f"recipe: {type(r).__name__} is not a Recipe, a name or a dict")


__all__ = ["Recipe", "recipes", "as_recipe"]
