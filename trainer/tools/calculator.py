"""The builtin calculator: arithmetic on numbers, evaluated from the expression's syntax tree (never eval)."""

from __future__ import annotations

import ast
import math
import operator

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64  # 10**64 stays small; 9**9**9 would take minutes and gigabytes
MAX_DIGITS = 100


class CalculatorError(ValueError):
    """The expression is not arithmetic the calculator does; the message goes back to the model."""


def calculate(expression: str) -> str:
    """The value of an arithmetic expression (+ - * / // % ** and parentheses on numbers) as text: an
    integer without a decimal point, a float as Python prints it."""
    if not isinstance(expression, str):
        raise CalculatorError(f"expression must be text, got {type(expression).__name__}")
    text = expression.strip().replace("×", "*").replace("^", "**")
    if not text:
        raise CalculatorError("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise CalculatorError(f"cannot parse {text!r}; write e.g. 123*456") from None
    value = _eval(tree.body)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CalculatorError("the result is not a finite number")
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)
    return str(value)


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent {right} is larger than {MAX_EXPONENT}")
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("the result is too large") from None
        if isinstance(value, int) and abs(value) >= 10**MAX_DIGITS:
            raise CalculatorError(f"the result has more than {MAX_DIGITS} digits")
        if isinstance(value, complex):
            raise CalculatorError("the result is not a real number")
        return value
    raise CalculatorError(f"{ast.unparse(node)!r} is not arithmetic on numbers; use + - * / // % ** and parentheses")
