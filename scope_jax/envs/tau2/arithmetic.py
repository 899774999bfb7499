"""The retail `calculate` tool's arithmetic: Python's own evaluation of + - * / ( ) . and digits.

tau2-bench evaluates the expression with Python's `eval` and no builtins; its character filter lets
`**` through, and `9**9**9**9` would then run for ever. So an expression with `**` is evaluated here by
walking its syntax tree with Python's own operators (same values, same error texts), and a power of
integers whose value would not fit a float is refused at once with the error Python's float conversion
would give it. Expressions without `**` go to `eval` exactly as in tau2-bench.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any

ALLOWED = set("0123456789+-*/(). ")
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_MAX_POWER_BITS = 1100  # a float holds integers of up to 1024 bits


def evaluate(expression: str) -> Any:
    """The value of an expression made of ALLOWED characters, as Python computes it."""
    source = expression.lstrip(" \t")  # what eval does with a string
    tree = ast.parse(source, filename="<string>", mode="eval")
    if not any(isinstance(node, ast.Pow) for node in ast.walk(tree)):
        return eval(compile(tree, "<string>", "eval"), {"__builtins__": None}, {})
    return _value(tree.body)


def _value(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.Tuple):
        return tuple(_value(element) for element in node.elts)
    raise ValueError("unsupported expression")


def _check_power(base: Any, exponent: Any) -> None:
    ints = all(isinstance(x, int) and not isinstance(x, bool) for x in (base, exponent))
    if ints and exponent > 0 and abs(base) > 1 and exponent * math.log2(abs(base)) > _MAX_POWER_BITS:
        raise OverflowError("int too large to convert to float")
