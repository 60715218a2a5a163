"""One helper function for every family of identical ones.

A deep network repeats its layers, so a training routine's helper functions (``target.py``: one
per top-level loop nest or contraction) come in families that differ only in the names of the
buffers they are passed, of their loop indices (``i<k>``, ``_i<k>``) and locals (``v<k>``), both
numbered across the routine, in the numbers of their runtime checks (the ``site`` argument
of ``ocannl_fail``, ``ocannl_index``, ...), and in the keys of their random numbers (the
``uint4x32_t`` literals a parameter's initialization passes to Threefry: the same init code per
layer, a key each). The C compiler's time is about linear in the text
it optimizes, so compiling each family once makes a deep network cost little more than a
shallow one.

Two helpers are the same function when their texts, comments aside, agree after renaming their
parameters and their numbered names in order of first appearance, and their check numbers and
keys too:
every renamed name is declared in the function (a parameter, a loop index, a local), so equal
texts compute the same thing from the same arguments. The first helper of a family is kept as
printed, and the calls of the others call it with their arguments in its parameter order. When
the members' check numbers differ, the kept helper takes them as parameters ``_site<k>``, so a
failed check still reports its own site; when their keys differ, it takes them as parameters
``_key<k>``. A source without families is left unchanged.

The drivers of packed GEMMs (``gemm_printer.py``) also come in families whose members differ
only in their integer constants: the sizes of their products, their operands' strides, their
buffers' bytes. Their hot loop is the micro-kernel, a function of its own compiled with its
constants (the driver's call names it, so members share it), and the driver's loops around it
lose nothing to sizes read from parameters; so the integers in which a family of drivers differs
are passed as parameters ``int64_t _n<k>`` (one per distinct column of values), those it agrees
on stay literals. An integer a C declaration or pragma needs constant (``collapse(4)``, an
array's size) is no parameter: drivers that differ there are different functions. The 46
products of the 2-block GPT's training step of ``bench/cpu_steps.py`` are 9 such functions, each
a call of the loops their tile shape shares (``gemm.shared_loops``), which differ in the
micro-kernel they name; with loops of their own, they were 15 drivers."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from ocannl.backends.c.target import NEST_FN, PART_FN, TILE_FN

_SIGNATURE = re.compile(rf"static (?:{NEST_FN}|{TILE_FN}|{PART_FN}) void (\w+)\($")
_IDENTIFIER = re.compile(r"([A-Za-z_]\w*)")
"""A name (and the letters of a number such as ``1e-05f``, which no renaming touches)."""
_NUMBERED = re.compile(r"_?[iv]\d+\Z")
"""The names :class:`~ocannl.lowlevel.ir.Namer` gives loop indices and locals (``_i<k>``: the
loop over the tiles of ``i<k>``, ``tile_printer.py``)."""
_SITE = re.compile(r"_status, (\d+)\b")
"""A check's number, the argument after the status cell (``ocannl_fail(_status, 3)``), where
:func:`_is_site` says the match is not the end of a longer name. (A leading ``\b`` would say it,
but would cost re its scan for the literal ``_status``: every helper's text is searched.)"""
_KEY = re.compile(r"\(\(uint4x32_t\)\{\{\d+u, \d+u, \d+u, \d+u\}\}\)")
"""A ``uint4x32_t`` literal (``ocannl/backends/c_family.py``, ``literal``): a Threefry key."""
_COMMENT = re.compile(r"/\*.*?\*/", re.DOTALL)
_INTEGER = re.compile(
    r"(/\*.*?\*/)"  # a comment
    r"|(^[ \t]*#[^\n]*)"  # a pragma or another preprocessor line
    r"|(^[ \t]*(?:const[ \t]+)?\w+[ \t]+\*?\w+\[[^\n]*)"  # an array's declaration
    r"|((?<!\w)_status, \d+)"  # a check's number (:data:`_SITE`)
    r"|((?<![\w.])\d+(?![\w.]))",  # an integer literal, not a piece of a float's or a name
    re.DOTALL | re.MULTILINE)
"""The integer literals of a packed GEMM's driver that may become parameters (the last group);
the other groups are what a match skips, the same way over a helper's text with and without its
comments (:func:`_integers`)."""
_SIZED = "ocannl_gemm_"
"""What the text of a packed GEMM's driver has and no other helper: the call of its micro-kernel."""
CALL = re.compile(r"(\s*)(\w+)\((.*)\);\Z")
"""A line calling a function, a statement of its own: the indentation, the callee, and the
arguments as the walk prints them, ``, ``-separated (``emit.py`` reads it too)."""


@dataclass(frozen=True)
class _Helper:
    lines: list[str]
    name: str
    params: tuple[str, ...]
    """The parameters' names, in the printed order; the last is the status cell."""
    sites: tuple[int, ...]
    """Its check numbers, in order of first appearance."""
    keys: tuple[str, ...]
    """Its :data:`_KEY` literals, in order of first appearance."""
    integers: tuple[int, ...]
    """A packed GEMM driver's integer literals that may become parameters (:data:`_INTEGER`), in
    order; ``()`` for other helpers, whose integers are in :attr:`key`."""
    key: str
    """Its text with comments dropped and its own names and check numbers renumbered."""
    canonical: dict[str, int]
    """Each parameter's name -> its number in :attr:`key`."""

    def canonical_args(self, args: list[str]) -> list[str]:
        """The arguments of a call of this helper, in the order of its renumbered parameters."""
        order = sorted(range(len(self.params)), key=lambda k: self.canonical[self.params[k]])
        return [args[k] for k in order]


def _parse(lines: list[str], helpers: dict[str, _Helper], family: dict[str, int]) -> _Helper | None:
    """The helper function ``lines`` as :class:`_Helper`, ``None`` for any other function;
    ``helpers`` and ``family`` (a helper's name -> its family's number) are those printed
    before it, which its calls name by family."""
    match = _SIGNATURE.match(lines[0])
    end = next((k for k, line in enumerate(lines) if line.endswith(") {")), None) if match else None
    if end is None:
        return None
    params = tuple(_IDENTIFIER.findall(line)[-1] for line in lines[1 : end + 1])
    body = [_canonical_call(line, helpers, family) for line in lines[end + 1 :]]
    text = _COMMENT.sub("", "\n".join(body))  # a comment may quote the loop IR's names
    renumbered: dict[int, int] = {}  # a check's number -> its number in the key, by first appearance

    def renumber(m: re.Match) -> str:
        if not _is_site(m):
            return m.group(0)
        return f"_status, @s{renumbered.setdefault(int(m.group(1)), len(renumbered))}"

    text = _SITE.sub(renumber, text)
    sites = tuple(renumbered)
    keys: dict[str, int] = {}  # a key's literal -> its number in the key, by first appearance
    text = _KEY.sub(lambda m: f"@k{keys.setdefault(m.group(0), len(keys))}", text)
    integers: list[int] = []
    if _SIZED in text and "@f" not in text:  # a driver calls no helper: its calls' numbers stay out
        text = _integers(text, lambda literal: integers.append(int(literal)) or "#")
    pieces = _IDENTIFIER.split(text)  # what is between the names, then a name, and so on
    names = pieces[1::2]
    own, order = set(params), {}
    for name in dict.fromkeys([*names, *params]):  # unused parameters last, in their order
        if name in own or _NUMBERED.match(name):
            order[name] = f"@{len(order)}"
    signature = sorted(" ".join(order.get(n, n) for n in _IDENTIFIER.findall(line)) for line in lines[1 : end + 1])
    # The text with a mark where each name stands, then the names renamed: one pass of re.
    key = "\n".join([lines[0][: match.start(1)], *signature, "$".join(pieces[0::2]),
                     " ".join([order.get(n, n) for n in names])])
    return _Helper(lines, match.group(1), params, sites, tuple(keys), tuple(integers), key,
                   {p: int(order[p][1:]) for p in params})


def _integers(text: str, replace: Callable[[str], str]) -> str:
    """``text`` with each integer literal :data:`_INTEGER` lets become a parameter replaced by
    ``replace(literal)``, in order."""
    return _INTEGER.sub(lambda m: replace(m.group(5)) if m.group(5) else m.group(0), text)


def _is_site(m: re.Match) -> bool:
    """Whether a match of :data:`_SITE` is a check's number: ``_status`` is a whole name."""
    before = m.string[m.start() - 1 : m.start()]
    return not (before.isalnum() or before == "_")


def _canonical_call(line: str, helpers: dict[str, _Helper], family: dict[str, int]) -> str:
    """``line``, a call of an earlier helper written as a call of its family, for keys: the
    arguments in the renumbered order, then the callee's check numbers and Threefry keys."""
    match = CALL.match(line)
    callee = helpers.get(match.group(2)) if match else None
    if callee is None:
        return line
    args, sites = callee.canonical_args(match.group(3).split(", ")), " ".join(map(str, callee.sites))
    integers = " ".join(map(str, callee.integers))
    return (f"{match.group(1)}@f{family[callee.name]}({', '.join(args)}; sites {sites}; keys {' '.join(callee.keys)}; "
            f"integers {integers});")


def share_identical_helpers(functions: list[list[str]], body: list[str]) -> tuple[list[list[str]], list[str]]:
    """``functions`` (each a function's lines, a helper after those it calls, ``target.py``)
    without the helpers identical to an earlier one (module docstring), and ``body``; their
    calls of a dropped helper call the kept one."""
    helpers: dict[str, _Helper] = {}
    family: dict[str, int] = {}
    families: dict[str, list[_Helper]] = {}
    number: dict[str, int] = {}
    for lines in functions:
        helper = _parse(lines, helpers, family)
        if helper is not None:
            family[helper.name] = number.setdefault(helper.key, len(number))
            families.setdefault(helper.key, []).append(helper)
            helpers[helper.name] = helper
    calls: dict[str, tuple[str, list[int], list[str]]] = {}
    """A helper's name -> the kept one's, per its parameter the argument to pass, and the check
    numbers and keys to pass before the status cell (none: the kept one has its own)."""
    kept: dict[str, list[str]] = {}
    for first, *others in (m for m in families.values() if len(m) > 1):
        by_site = any(m.sites != first.sites for m in others)
        by_key = any(m.keys != first.keys for m in others)
        # The integers the members differ in, a parameter per distinct column of values.
        columns = list(zip(*(m.integers for m in [first, *others])))
        varying = list(dict.fromkeys(c for c in columns if len(set(c)) > 1))
        by_integer = [varying.index(c) if c in varying else None for c in columns]
        kept[first.name] = _with_constant_params(first, by_site, by_key, by_integer)
        for member, m in enumerate([first, *others]):
            position = {m.canonical[p]: k for k, p in enumerate(m.params)}
            constants = [*map(str, m.sites if by_site else ()), *(m.keys if by_key else ()),
                         *(str(values[member]) for values in varying)]
            calls[m.name] = (first.name, [position[first.canonical[p]] for p in first.params], constants)
    if not calls:
        return functions, body
    out = []
    for lines in functions:
        name = _SIGNATURE.match(lines[0])
        helper = helpers.get(name.group(1)) if name else None
        if helper is None or helper.name not in calls:
            out.append(_redirect(lines, calls))
        elif helper.name in kept:
            out.append(_redirect(kept[helper.name], calls))
    return out, _redirect(body, calls)


def _with_constant_params(helper: _Helper, sites: bool, keys: bool, integers: list[int | None]) -> list[str]:
    """``helper``'s lines taking its check numbers (``sites``) as parameters ``int _site<k>``,
    its Threefry keys (``keys``) as parameters ``uint4x32_t _key<k>`` and its integer literals
    as parameters ``int64_t _n<k>`` (``integers``: per literal of :attr:`_Helper.integers`, its
    parameter's number, ``None`` where it stays), before the status cell."""
    count = len(set(integers) - {None})
    if not (sites or keys or count):
        return helper.lines
    end = 1 + len(helper.params)
    def site(m: re.Match) -> str:  # a number quoted in a comment stays
        n = int(m.group(1))
        return f"_status, _site{helper.sites.index(n)}" if _is_site(m) and n in helper.sites else m.group(0)

    body = helper.lines[end:]
    if sites:
        body = [_SITE.sub(site, line) for line in body]
    if keys:
        body = [_KEY.sub(lambda m: f"_key{helper.keys.index(m.group(0))}", line) for line in body]
    if count:
        at = iter(integers)
        body = _integers("\n".join(body), lambda literal: literal if (k := next(at)) is None else f"_n{k}").split("\n")
    params = [f"    int _site{k}," for k in range(len(helper.sites) if sites else 0)]
    params += [f"    uint4x32_t _key{k}," for k in range(len(helper.keys) if keys else 0)]
    params += [f"    int64_t _n{k}," for k in range(count)]
    return helper.lines[: end - 1] + params + [helper.lines[end - 1]] + body


def _redirect(lines: list[str], calls: dict[str, tuple[str, list[int], list[str]]]) -> list[str]:
    """``lines`` with each call of a helper of a family calling the family's kept helper."""
    result = []
    for line in lines:
        match = CALL.match(line)
        if match and match.group(2) in calls:
            name, order, constants = calls[match.group(2)]
            args = match.group(3).split(", ")
            args = [args[k] for k in order]
            args[-1:-1] = constants
            line = f"{match.group(1)}{name}({', '.join(args)});"
        result.append(line)
    return result
