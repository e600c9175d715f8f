#!/usr/bin/env python3
"""check_structure.py — the layering and size rules of CONTRIBUTING.md, checked.

  tools/check_structure.py [--root DIR]

Fails (exit 1, one line per finding: file, line, rule) on
- an include that crosses the layering: a file of folder A including a
  header of folder B where LAYERS does not let A depend on B (engine/models
  sees engine/core only; strategies and transport plugins see the public
  headers, their own folder and, for strategies, strategies/common);
- an arrow back up: an include between top-level folders that TOP_LAYERS
  does not have (the engine, the strategies and the transport plugins each
  use the public headers, and nothing of each other), a top-level folder of
  sources outside the layering, or a LAYERS table that runs in a circle or
  lets one top-level folder use another;
- a layer above the models including a model's layers (layers.h,
  kernels.h, cuda/): config, train and the rest see a model through
  MODEL_INTERFACE (what a model is, which exist, the compute lent to
  strategies, the BLAS in use);
- a getenv in engine/ outside engine/core/env.cpp (the environment is read
  once, at start-up, into one struct);
- a class of engine/ deriving from a plugin SDK type (plugin::Failure ...):
  the engine's errors are its own, converted at the ABI;
- a source file over its budget (BUDGETS: the public header and each of
  its parts 400 lines, a plugin or strategy file 600, an engine or model
  file 500);
- a function over 80 lines outside tests/ (C, C++, CUDA, Python, shell);
- a string literal in engine/ code that names a shipped strategy (the
  engine names no strategy; the config's default plugin aside);
- a reference to a path outside the repository (the workplace's shared
  folder, a relative path or Markdown link that leaves it), or to a
  repository path that does not exist (a path named in prose or a comment,
  or a relative Markdown link): docs must not point at what moved.

Includes resolve as the compiler sees them: "x.h" next to the including
file first, then in the folders the including folder may depend on; a
header found only in a folder it may not depend on is the finding. The
folders' CMake targets give the compiler the same view (each target's
include directory is its own folder), so this check and the build agree.
Pure Python 3 (Debian's), no third-party modules.
"""
import argparse
import ast
import os
import re
import subprocess
import sys

# Folder -> the folders its files may include from (besides their own). A
# folder not listed takes the rule of its nearest listed parent.
PUBLIC = "plugins/include"
LAYERS = {
    "engine/core": [PUBLIC],
    "engine/models": ["engine/core", PUBLIC],
    "engine/config": ["engine/models", "engine/core", PUBLIC],
    "engine/io": ["engine/config", "engine/models", "engine/core", PUBLIC],
    "engine/host": ["engine/io", "engine/config", "engine/models", "engine/core", PUBLIC],
    "engine/train": ["engine/host", "engine/io", "engine/config", "engine/models", "engine/core", PUBLIC],
    "engine/launch": ["engine/core", PUBLIC],
    "engine/bench": ["engine/launch", "engine/host", "engine/io", "engine/config", "engine/core", PUBLIC],
    "engine/blas": ["engine/io", "engine/config", "engine/models", "engine/core", PUBLIC],
    "engine/plan": ["engine/host", "engine/config", "engine/models", "engine/core", PUBLIC],
    "engine": ["engine/blas", "engine/plan", "engine/bench", "engine/launch", "engine/train", "engine/host", "engine/io",
               "engine/config", "engine/models", "engine/core", PUBLIC],
    PUBLIC: [],
    "plugins": [PUBLIC],
    "strategies/common": [PUBLIC],
    "strategies": ["strategies/common", PUBLIC],
}
# Folders whose files are not checked for layering (they may use anything).
UNLAYERED = ("tests", "tools", "cmake")
# The top-level folders and what each may include of the others: the
# arrows between them all point down, to the public headers.
TOP_LAYERS = {PUBLIC: [], "engine": [PUBLIC], "strategies": [PUBLIC], "plugins": [PUBLIC]}
# What a layer above the models may include of them; a model's layers
# (layers.h, kernels.h, cuda/) are the models' own, and engine/blas's, which
# measures their GEMMs.
MODEL_INTERFACE = ("engine/models/model.h", "engine/models/registry.h", "engine/models/compute.h",
                   "engine/models/blas_info.h")
MODEL_LAYERS_SEEN_BY = ("engine/models", "engine/blas")
# The one file of engine/ that reads the environment (env.h).
ENV_MODULE = "engine/core/env.cpp"

SOURCE = (".h", ".hpp", ".c", ".cpp", ".cu", ".cuh")
# (path prefix, suffixes, lines): the first match applies.
BUDGETS = [
    ("plugins/include/ddp/plugin.h", (".h",), 400),
    ("plugins/include/ddp/abi/", (".h",), 400),  # each part of the public header
    ("plugins/", SOURCE, 600),
    ("strategies/", SOURCE, 600),
    ("engine/", SOURCE, 500),
]
FUNCTION_LINES = 80
TOP = ("engine", "models", "plugins", "strategies", "configs", "tools", "tests", "docs", "cmake", ".ci")
# A repository path as prose names it: a top-level folder, then a file with
# an extension (no globs or placeholders).
PATH_RE = re.compile(r"(?<![\w./-])((?:%s)/[\w./+-]*\.(?:h|hpp|c|cpp|cu|md|py|sh|toml|txt|cmake|json|png|csv|in))(?![\w/-])"
                     % "|".join(re.escape(t) for t in TOP))
LINK_RE = re.compile(r"\]\(([^)\s]+)\)")  # a Markdown link's target
OUTSIDE_RE = re.compile(r"\.\./shared|/work/|notes/toolchain\.md|spec/models\.md|shared/(?:DESIGN|STYLE)\.md")
# A relative path that climbs: it must stay inside the repository.
CLIMB_RE = re.compile(r"(?<![\w/.])((?:\.\./)+[\w][\w./-]*)")


def tracked_files(root):
    """The repository's files: git's list, or (outside a git checkout) every file but build outputs."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                             capture_output=True, check=True).stdout
        files = out.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        files = [os.path.relpath(os.path.join(d, f), root) for d, dirs, fs in os.walk(root)
                 for f in fs if not os.path.relpath(d, root).split(os.sep)[0].startswith((".git", "build", "runs"))]
    return sorted(p for p in files if p and os.path.isfile(os.path.join(root, p)))


def folder_rule(path):
    """The LAYERS key that governs `path` (a file), or None if unlayered."""
    parts = os.path.dirname(path).split("/")
    if parts[0] in UNLAYERED:
        return None
    for n in range(len(parts), 0, -1):
        key = "/".join(parts[:n])
        if key in LAYERS:
            return key
    return None


def own_folder(path):
    """The folder a file belongs to for 'its own folder': its plugin, or its LAYERS key."""
    parts = path.split("/")
    if parts[0] in ("plugins", "strategies") and len(parts) > 2 and "/".join(parts[:2]) not in (PUBLIC, "strategies/common"):
        return "/".join(parts[:2])
    return folder_rule(path)


INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)


def header_index(files):
    """basename -> [paths] of the repository's headers."""
    headers = {}
    for f in files:
        if f.endswith((".h", ".hpp", ".cuh")):
            headers.setdefault(os.path.basename(f), []).append(f)
    return headers


def check_includes(root, files, findings):
    headers = header_index(files)
    for f in files:
        if not f.endswith(SOURCE):
            continue
        rule = folder_rule(f)
        if rule is None:
            continue
        allowed = [own_folder(f)] + LAYERS[rule]
        text = open(os.path.join(root, f), encoding="utf-8", errors="replace").read()
        for m in INCLUDE_RE.finditer(text):
            kind, name = m.group(1), m.group(2)
            line = text.count("\n", 0, m.start()) + 1
            target = resolve(root, f, kind, name, headers, allowed)
            if target is None:
                continue  # a system or third-party header
            where = own_folder(target) or os.path.dirname(target)
            if not any(where == a or where.startswith(a + "/") for a in allowed):
                findings.append(f"{f}:{line}: includes {target}: {rule}/ may not depend on {where}/ "
                                f"(it may use: {', '.join(LAYERS[rule]) or 'nothing else'})")


def resolve(root, f, kind, name, headers, allowed):
    """The repository file an include names, as the compiler would find it; None for a header
    outside the repository. <...> and "..." alike: CMake's include directories serve both."""
    public = os.path.normpath(os.path.join(PUBLIC, name))
    if kind == "<" and os.path.isfile(os.path.join(root, public)):
        return public
    near = os.path.normpath(os.path.join(os.path.dirname(f), name))
    if kind == '"' and os.path.isfile(os.path.join(root, near)):
        return near
    candidates = [h for h in headers.get(os.path.basename(name), []) if h == name or h.endswith("/" + name)]
    if not candidates:
        return None
    for c in candidates:  # the compiler finds the one in a folder it may see
        folder = own_folder(c) or ""
        if any(folder == a or folder.startswith(a + "/") for a in allowed if a):
            return c
    return candidates[0]


def top_unit(path):
    """The top-level folder a path belongs to (the public headers apart from plugins/)."""
    return PUBLIC if path.startswith(PUBLIC + "/") or path == PUBLIC else path.split("/")[0]


def layer_cycle(layers):
    """A circle in the LAYERS table (a list of folders, first repeated last), or None."""
    state = {}

    def visit(node, path):
        state[node] = "open"
        for dep in layers.get(node, []):
            if dep == node:
                continue
            if state.get(dep) == "open":
                return path[path.index(dep):] + [dep] if dep in path else [node, dep, node]
            if dep not in state:
                found = visit(dep, path + [dep])
                if found:
                    return found
        state[node] = "done"
        return None

    for key in layers:
        if key not in state:
            found = visit(key, [key])
            if found:
                return found
    return None


def check_top_layers(root, files, findings, layers=None):
    """The arrows between top-level folders point down (TOP_LAYERS): in the
    LAYERS table, which runs in no circle, and in every include."""
    layers = LAYERS if layers is None else layers
    cycle = layer_cycle(layers)
    if cycle:
        findings.append(f"tools/check_structure.py: LAYERS runs in a circle: {' -> '.join(cycle)}")
    for key, deps in layers.items():
        for dep in deps:
            if top_unit(dep) != top_unit(key) and top_unit(dep) not in TOP_LAYERS.get(top_unit(key), []):
                findings.append(f"tools/check_structure.py: LAYERS lets {key}/ use {dep}/: an arrow back up "
                                f"between top-level folders ({top_unit(key)}/ may use: "
                                f"{', '.join(TOP_LAYERS.get(top_unit(key), [])) or 'nothing'})")
    headers = header_index(files)
    outside = set()
    for f in files:
        if not f.endswith(SOURCE) or "/" not in f or f.split("/")[0] in UNLAYERED:
            continue
        unit = top_unit(f)
        if unit not in TOP_LAYERS and unit not in outside:
            outside.add(unit)
            findings.append(f"{unit}/: a top-level folder of sources outside the layering (TOP_LAYERS and "
                            f"LAYERS in tools/check_structure.py, and CONTRIBUTING.md)")
        text = open(os.path.join(root, f), encoding="utf-8", errors="replace").read()
        allowed = ([own_folder(f)] + LAYERS[folder_rule(f)]) if folder_rule(f) else [os.path.dirname(f)]
        for m in INCLUDE_RE.finditer(text):
            target = resolve(root, f, m.group(1), m.group(2), headers, allowed)
            if target is None or top_unit(target) == unit or top_unit(target) in TOP_LAYERS.get(unit, []):
                continue
            line = text.count("\n", 0, m.start()) + 1
            findings.append(f"{f}:{line}: includes {target}: an arrow back up between top-level folders: "
                            f"{unit}/ may not use {top_unit(target)}/ "
                            f"(it may use: {', '.join(TOP_LAYERS.get(unit, [])) or 'nothing'})")


def check_model_layers(root, files, findings):
    """Above the models, a model is seen through MODEL_INTERFACE, not its layers."""
    headers = header_index(files)
    for f in files:
        rule = folder_rule(f)
        if not f.endswith(SOURCE) or not rule or not rule.startswith("engine") or \
                any(rule == s or rule.startswith(s + "/") for s in MODEL_LAYERS_SEEN_BY):
            continue
        text = open(os.path.join(root, f), encoding="utf-8", errors="replace").read()
        for m in INCLUDE_RE.finditer(text):
            target = resolve(root, f, m.group(1), m.group(2), headers, [own_folder(f)] + LAYERS[rule])
            if target and target.startswith("engine/models/") and target not in MODEL_INTERFACE:
                line = text.count("\n", 0, m.start()) + 1
                findings.append(f"{f}:{line}: includes {target}: {rule}/ sees a model through "
                                f"{', '.join(os.path.basename(h) for h in MODEL_INTERFACE)}, not its layers")


def check_engine_code(root, files, findings):
    """In engine/: getenv only in ENV_MODULE; no class derives from a plugin SDK type."""
    getenv = re.compile(r"\b(?:secure_)?getenv\b")
    derived = re.compile(r"\b(?:class|struct)\s+(\w+)(?:\s+final)?\s*:(?!:)([^;{]*)\{")
    for f in files:
        if not f.startswith("engine/") or not f.endswith(SOURCE):
            continue
        code = strip_c(open(os.path.join(root, f), encoding="utf-8", errors="replace").read())
        if f != ENV_MODULE:
            for m in getenv.finditer(code):
                findings.append(f"{f}:{code.count(chr(10), 0, m.start()) + 1}: reads the environment with "
                                f"{m.group(0)}: the engine reads it once, in {ENV_MODULE} (env().get(name), or "
                                f"a field of Env)")
        for m in derived.finditer(code):
            if re.search(r"\bplugin::|\bFailure\b", m.group(2)):
                findings.append(f"{f}:{code.count(chr(10), 0, m.start()) + 1}: class {m.group(1)} derives from "
                                f"the plugin SDK ({' '.join(m.group(2).split())}): the engine's errors are its "
                                f"own, converted to a status at the ABI (host_guard)")


def check_folders(files, findings):
    """Every folder of engine/ with sources is a layer of its own, in LAYERS."""
    for folder in sorted({"/".join(f.split("/")[:2]) for f in files if f.startswith("engine/") and f.count("/") > 1}):
        if folder not in LAYERS:
            findings.append(f"{folder}/: a folder of the engine that is not in the layering table "
                            f"(LAYERS in tools/check_structure.py, and CONTRIBUTING.md)")


def check_budgets(root, files, findings):
    for f in files:
        for prefix, suffixes, limit in BUDGETS:
            if f.startswith(prefix) and f.endswith(suffixes):
                n = count_lines(root, f)
                if n > limit:
                    findings.append(f"{f}:{n}: {n} lines, over the budget of {limit} for {prefix}")
                break


def count_lines(root, f):
    with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
        return sum(1 for _ in fh)


def strip_c(text):
    """C/C++ text with comments, strings and character literals blanked (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i)); i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j])); i = j
        elif c == 'R' and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            k = text.find("(", i)
            delim = ")" + text[i + 2:k] + '"'
            j = text.find(delim, k)
            j = n if j < 0 else j + len(delim)
            out.append(re.sub(r"[^\n]", " ", text[i:j])); i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(" " * (min(j + 1, n) - i)); i = min(j + 1, n)
        else:
            out.append(c); i += 1
    return "".join(out)


def c_functions(text):
    """(name, first line, last line) of each function body in C/C++/CUDA text.

    A function body is a brace block whose opening follows a ')' (possibly
    with qualifiers, an initializer list or a trailing return type) at a
    level where only namespaces, classes and extern "C" blocks enclose it.
    Lambdas and blocks inside a body count as part of it.
    """
    s = strip_c(text)
    s = re.sub(r"^[ \t]*#.*$", lambda m: " " * len(m.group(0)), s, flags=re.M)  # preprocessor lines
    found, stack, i = [], [], 0
    for m in re.finditer(r"[{}]", s):
        pos = m.start()
        if s[pos] == "{":
            head = s[max(0, pos - 400):pos]
            is_body = not any(k == "body" for k in stack) and re.search(
                r"\)\s*(?:const|noexcept|override|final|mutable|try|->\s*[\w:<>,\s*&]+|\s|:[^;{}]*)*$", head) \
                and not re.search(r"\b(?:namespace|class|struct|union|enum|extern\s+\"C\")\b[^;{})]*$", head) \
                and not re.search(r"=\s*$", head)
            if is_body:
                name = re.search(r"([~\w:]+)\s*\([^()]*(?:\([^()]*\)[^()]*)*\)[^()]*$", head)
                stack.append("body")
                stack.append((name.group(1) if name else "?", s.count("\n", 0, pos) + 1))
            else:
                stack.append("block")
        else:
            if not stack:
                continue
            top = stack.pop()
            if isinstance(top, tuple):
                stack.pop()  # its "body" marker
                found.append((top[0], top[1], s.count("\n", 0, pos) + 1))
    return found


def check_functions(root, files, findings):
    for f in files:
        if f.startswith("tests/") or "/tests/" in f:
            continue
        path = os.path.join(root, f)
        if f.endswith(SOURCE):
            text = open(path, encoding="utf-8", errors="replace").read()
            funcs = c_functions(text)
        elif f.endswith(".py"):
            try:
                tree = ast.parse(open(path, encoding="utf-8").read())
            except SyntaxError as e:
                findings.append(f"{f}:{e.lineno}: does not parse: {e.msg}")
                continue
            funcs = [(n.name, n.lineno, n.end_lineno) for n in ast.walk(tree)
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        elif f.endswith(".sh") or f == ".ci/run":
            funcs = shell_functions(open(path, encoding="utf-8", errors="replace").read())
        else:
            continue
        for name, first, last in funcs:
            if last - first + 1 > FUNCTION_LINES:
                findings.append(f"{f}:{first}: function {name} has {last - first + 1} lines (at most {FUNCTION_LINES})")


def shell_functions(text):
    found, lines = [], text.split("\n")
    for i, line in enumerate(lines):
        m = re.match(r"^(?:function\s+)?([\w-]+)\s*\(\)\s*\{\s*$", line)
        if m:
            for j in range(i + 1, len(lines)):
                if lines[j].startswith("}"):
                    found.append((m.group(1), i + 1, j + 1))
                    break
    return found


def check_references(root, files, findings):
    exists = set(files)
    for f in files:
        if f.endswith((".png", ".safetensors", ".bin")) or f == "tools/check_structure.py":
            continue
        try:
            text = open(os.path.join(root, f), encoding="utf-8").read()
        except UnicodeDecodeError:
            continue
        for lineno, line in enumerate(text.split("\n"), 1):
            if OUTSIDE_RE.search(line):
                findings.append(f"{f}:{lineno}: refers to a path outside the repository: {OUTSIDE_RE.search(line).group(0)}")
            if f.endswith(".md"):
                for m in LINK_RE.finditer(line):
                    target = m.group(1).split("#")[0]
                    if not target or re.match(r"[a-z]+:", target):
                        continue  # an anchor in the page, or a URL
                    path = os.path.normpath(os.path.join(os.path.dirname(f), target))
                    if path.startswith("..") or not os.path.exists(os.path.join(root, path)):
                        findings.append(f"{f}:{lineno}: links to {target}, which is not in the repository")
            if f.startswith("tests/") and not f.endswith(".md"):
                continue  # tests name files they make (configs/x.toml in a temporary directory)
            for m in CLIMB_RE.finditer(line):
                path = os.path.normpath(os.path.join(os.path.dirname(f), m.group(1)))
                if path.startswith(".."):
                    findings.append(f"{f}:{lineno}: refers to a path outside the repository: {m.group(1)}")
            for m in PATH_RE.finditer(line):
                p = m.group(1).rstrip(".")
                if p not in exists and not os.path.isdir(os.path.join(root, p)):
                    findings.append(f"{f}:{lineno}: names {p}, which is not in the repository")


# The one place the engine may name a strategy: the config's default plugin.
NAMED_STRATEGY_ALLOWED = {("engine/config/config.cpp", "naive"), ("engine/config/config.h", "naive")}


def check_strategy_names(root, files, findings):
    """The engine names no strategy: no string literal in engine/ code is a
    shipped strategy's name (what a strategy does is its plugin's to say:
    its plan entry, its stats), but for the config's default plugin."""
    names = sorted({f.split("/")[1] for f in files if f.startswith("strategies/") and f.count("/") > 1}
                   - {"common", "example"})
    if not names:
        return
    literal = re.compile(r'"(%s)"' % "|".join(re.escape(n) for n in names))
    for f in files:
        if not f.startswith("engine/") or not f.endswith(SOURCE):
            continue
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                code = line.split("//")[0]
                for m in literal.finditer(code):
                    if (f, m.group(1)) not in NAMED_STRATEGY_ALLOWED:
                        findings.append(f"{f}:{n}: names the strategy \"{m.group(1)}\" (the engine names no "
                                        f"strategy: let the plugin say it, through its plan entry or stats)")

# ---------------------------------------------------------------- comma rule
# Statements joined by the comma operator (`a = 1, b = 2;`, `f(), g();`,
# `x++, y++;` outside a for header) and declaration lists (`int a = 0, b;`)
# in C/C++ product code: one statement or declaration per line, so that a
# line budget is not met by joining lines. COMMA_RULE_REPORT_ONLY lists the
# folders whose findings are printed as notes and do not fail the check
# (engine/train/ and engine/host/ until their findings are fixed; then
# empty it).
COMMA_RULE_FOLDERS = ("engine/", "plugins/", "strategies/")
COMMA_RULE_REPORT_ONLY = ("engine/train/", "engine/host/")
COMMA_BLOCK_WORDS = {"else", "do", "try", "mutable", "noexcept", "const", "override", "final"}
COMMA_HEAD_RE = re.compile(r"\b(?:namespace|class|struct|union|enum|extern)\b[^;{}()]*$")
COMMA_TEMPLATE_RE = re.compile(r"<[^<>;{}]*>")


def strip_preprocessor(text):
    """Text with preprocessor directives blanked, continuation lines too (newlines kept)."""
    lines, out, directive = text.split("\n"), [], False
    for line in lines:
        if directive or re.match(r"[ \t]*#", line):
            directive = line.endswith("\\")
            out.append(" " * len(line))
        else:
            out.append(line)
    return "\n".join(out)


def opens_block(head):
    """Whether a '{' after `head` (the statement's text so far, nested brackets emptied) opens a
    body or scope (a function, a control statement, a lambda, a class or namespace) rather than a
    braced initialiser: a body ends the statement before it (a class head, a constructor's
    initialiser list)."""
    tail = head.rstrip()
    if not tail or tail[-1] in ")]};{" or (tail[-1] == ":" and not tail.endswith("::")):
        return True
    word = re.search(r"(\w+)$", tail)
    return bool(word and word.group(1) in COMMA_BLOCK_WORDS) or bool(COMMA_HEAD_RE.search(tail))


def joined_by_comma(statement):
    """Whether a statement's top-level text (nested brackets emptied) joins parts with a comma,
    once template argument lists are dropped."""
    previous = None
    while previous != statement:
        previous, statement = statement, COMMA_TEMPLATE_RE.sub("", statement)
    return "," in statement


def comma_statements(text):
    """The lines of C/C++ `text` where a statement or declaration joins parts with a comma.

    Commas inside parentheses (calls, for headers, parameter lists, macros'
    arguments), brackets, braces (initialisers, enums: a brace holds a scope
    of its own, whose statements end in ';'), template argument lists,
    strings, comments and preprocessor lines are not findings.
    """
    s = strip_preprocessor(strip_c(text))
    found = []
    # Each scope: [its brackets still open, the statement's top-level text, the first comma's position].
    scopes = [[[], [], None]]
    for i, c in enumerate(s):
        brackets, statement, comma = scopes[-1]
        if brackets and c in "([":
            brackets.append(c)
        elif brackets and c in ")]":
            brackets.pop()
            if not brackets:
                statement.append(c)
        elif brackets and c not in "{}":
            continue
        elif c in "([":
            brackets.append(c)
            statement.append(c)
        elif c == "{":
            if not brackets and opens_block("".join(statement)):
                scopes[-1][1:] = [[], None]
            else:
                statement.append("{}")
            scopes.append([[], [], None])
        elif c == "}":
            if len(scopes) > 1:
                scopes.pop()
        elif c == ";":
            if comma is not None and joined_by_comma("".join(statement)):
                found.append(s.count("\n", 0, comma) + 1)
            scopes[-1][1:] = [[], None]
        else:
            if c == "," and comma is None:
                scopes[-1][2] = i
            statement.append(c)
    return found


def check_commas(root, files, findings, notes):
    for f in files:
        if not f.startswith(COMMA_RULE_FOLDERS) or not f.endswith(SOURCE):
            continue
        text = open(os.path.join(root, f), encoding="utf-8", errors="replace").read()
        for line in comma_statements(text):
            finding = (f"{f}:{line}: a comma joins statements or declarations (`a = 1, b = 2;`, `int a, b;`): "
                       f"write one per line")
            (notes if f.startswith(COMMA_RULE_REPORT_ONLY) else findings).append(finding)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    files = tracked_files(root)
    findings = []
    check_folders(files, findings)
    check_includes(root, files, findings)
    check_top_layers(root, files, findings)
    check_model_layers(root, files, findings)
    check_engine_code(root, files, findings)
    check_budgets(root, files, findings)
    check_functions(root, files, findings)
    check_references(root, files, findings)
    check_strategy_names(root, files, findings)
    notes = []
    check_commas(root, files, findings, notes)
    for line in notes:
        print(f"note (report-only, COMMA_RULE_REPORT_ONLY): {line}")
    for line in findings:
        print(line)
    if findings:
        print(f"check_structure: {len(findings)} finding(s); the rules are in CONTRIBUTING.md", file=sys.stderr)
        return 1
    print(f"check_structure: {len(files)} files: layering (arrows down, models' layers, getenv, errors), budgets, "
          f"function sizes and references hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
