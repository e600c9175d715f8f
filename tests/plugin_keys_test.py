#!/usr/bin/env python3
"""plugin_keys_test.py — every plugin folder has a README whose "## Keys"
table lists exactly the keys the plugin reads.

A plugin folder is strategies/<name>/ or plugins/<name>/ (not common/ or
include/). The keys a plugin reads are the literal first arguments of its
config_int/config_float/config_bool/config_string calls, through the host
vtable or ddp::plugin::Host, in its own sources and in the strategies/common
headers they include (bucket_mb is read in common/bucket_cap.h). The README's
keys are the backquoted names in the first column of the table under
"## Keys"; a section that says "None" and has no table lists no key. The
table's type column must name each type a key is read as (int, float, bool,
string), and its default column the default the code gives as a literal.

Every plugin declares in its descriptor (a ddp_key array, kKeys; kNoKeys
for none) exactly the keys it reads. The launcher refuses a key no plugin
declares before any rank starts, and a rank one its plugin did not read;
this keeps the documentation and the declarations from drifting.
"""
import os
import re
import sys
import tempfile
import unittest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
# config_<type>([host->ctx,] "key", default ...
READ_RE = re.compile(r'config_(int|float|bool|string)\s*\(\s*(?:[\w.>-]+\s*,\s*)?"(\w+)"\s*,\s*([^,)]*)')
# Where a plugin's quoted includes are found besides its own folder: the include directories its
# CMake target sees.
INCLUDE_DIRS = [os.path.join(ROOT, "strategies", "common"), os.path.join(ROOT, "plugins", "include")]
INCLUDE_RE = re.compile(r'#\s*include\s*"([^"]+)"')
SOURCE = (".c", ".cc", ".cpp", ".cu", ".h", ".hpp")


def plugin_folders():
    out = []
    for top, skip in (("strategies", {"common"}), ("plugins", {"include"})):
        for name in sorted(os.listdir(os.path.join(ROOT, top))):
            path = os.path.join(ROOT, top, name)
            if os.path.isdir(path) and name not in skip:
                out.append(path)
    return out


def reads(folder):
    """{key: [(type, default expression), ...]} read by the sources of `folder` and the
    headers they include, transitively (next to the includer first, then INCLUDE_DIRS)."""
    found, seen = {}, set()
    todo = [os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(SOURCE)]
    while todo:
        path = os.path.normpath(todo.pop())
        if path in seen:
            continue
        seen.add(path)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for type_, key, default in READ_RE.findall(text):
            found.setdefault(key, []).append((type_, default.strip()))
        for inc in INCLUDE_RE.findall(text):
            for d in [os.path.dirname(path)] + INCLUDE_DIRS:
                if os.path.isfile(os.path.join(d, inc)):
                    todo.append(os.path.join(d, inc))
                    break
    return found


def keys_read(folder):
    return set(reads(folder))


# A declared key, ddp_key {"name", "type", "help"}: a quoted word opening a brace, in the
# plugin's own sources.
DECLARED_RE = re.compile(r'\{\s*"(\w+)"\s*,\s*"(?:[^"\\]|\\.)*"\s*,')


def keys_declared(folder):
    """The keys `folder`'s sources declare in their ddp_key arrays; None if they declare none
    (no kKeys array and no kNoKeys)."""
    names, any_array = set(), False
    for f in os.listdir(folder):
        if f.endswith(SOURCE):
            with open(os.path.join(folder, f), encoding="utf-8") as src:
                text = src.read()
            m = re.search(r"ddp_key\s+kKeys\[\]\s*=\s*\{(.*?)\n\};", text, re.S)
            if m:
                any_array = True
                names |= set(DECLARED_RE.findall(m.group(1)))
            any_array |= "kNoKeys" in text
    return names if any_array else None


def literal(expression):
    """The value a default expression spells, as a README writes it; None if it is not a literal."""
    if re.fullmatch(r'"[^"]+"', expression) or re.fullmatch(r"-?\d+(\.\d+)?", expression):
        return expression.strip('"')
    if expression in ("true", "false"):
        return expression
    return None


def documented(readme):
    """{key: (type cell, default cell)} of the README's "## Keys" table; None if there is no such section."""
    with open(readme, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"^## Keys\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    if not m:
        return None
    rows = [line for line in m.group(1).split("\n") if line.startswith("|")]
    keys = {}
    for row in rows[2:]:  # past the header and the |---| line
        cells = [c.strip() for c in row.split("|")[1:-1]]
        name = re.fullmatch(r"`(\w+)`", cells[0])
        if name:
            keys[name.group(1)] = (cells[1] if len(cells) > 1 else "", cells[2] if len(cells) > 2 else "")
    if not rows and not re.search(r"\bNone\b", m.group(1)):
        return None
    return keys


def keys_documented(readme):
    table = documented(readme)
    return None if table is None else set(table)


class PluginReadmes(unittest.TestCase):
    def test_a_header_found_through_the_include_directory_is_followed(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "x.cpp"), "w") as f:
                f.write('#include "bucket_cap.h"\n')
            self.assertIn("bucket_mb", keys_read(d))

    def test_the_scan_finds_what_the_plugins_are_known_to_read(self):
        # If this fails, READ_RE no longer matches how plugins read keys.
        self.assertEqual(keys_read(os.path.join(ROOT, "plugins", "gloo")), {"hostname", "interface", "algorithm"})
        self.assertEqual(keys_read(os.path.join(ROOT, "strategies", "bucketed")),
                         {"bucket_mb", "overlap_optimizer", "compress", "in_place"})
        self.assertEqual(keys_declared(os.path.join(ROOT, "strategies", "bucketed")),
                         {"bucket_mb", "overlap_optimizer", "compress", "in_place"})
        self.assertEqual(keys_read(os.path.join(ROOT, "strategies", "flat")), {"in_place"})
        self.assertEqual(keys_declared(os.path.join(ROOT, "strategies", "flat")), {"in_place"})
        self.assertEqual(keys_declared(os.path.join(ROOT, "strategies", "naive")), set())
        self.assertEqual(keys_read(os.path.join(ROOT, "strategies", "naive")), set())

    def test_every_plugin_readme_lists_exactly_the_keys_it_reads(self):
        folders = plugin_folders()
        self.assertGreaterEqual(len(folders), 8)
        for folder in folders:
            name = os.path.relpath(folder, ROOT)
            with self.subTest(plugin=name):
                readme = os.path.join(folder, "README.md")
                self.assertTrue(os.path.isfile(readme), f"{name} has no README.md")
                documented = keys_documented(readme)
                self.assertIsNotNone(documented, f"{name}/README.md has no '## Keys' section (a table, or 'None')")
                self.assertEqual(documented, keys_read(folder),
                                 f"{name}/README.md's key table differs from the keys {name} reads")

    def test_every_plugin_declares_exactly_the_keys_it_reads(self):
        # ddp_key arrays: the launcher refuses, before any rank starts, a key not declared.
        for folder in plugin_folders():
            name = os.path.relpath(folder, ROOT)
            with self.subTest(plugin=name):
                self.assertEqual(keys_declared(folder), keys_read(folder),
                                 f"{name}: the keys its descriptor declares differ from those it reads")

    def test_every_readme_gives_the_type_and_literal_default_the_plugin_reads(self):
        for folder in plugin_folders():
            name = os.path.relpath(folder, ROOT)
            table = documented(os.path.join(folder, "README.md")) or {}
            for key, calls in reads(folder).items():
                type_cell, default_cell = table.get(key, ("", ""))
                for type_, default in calls:
                    with self.subTest(plugin=name, key=key, type=type_):
                        self.assertIn(type_, type_cell.lower(), f"{name}/README.md: `{key}` is read as {type_}")
                        value = literal(default)
                        if value:  # a named constant or "" (a second read) is not checked
                            self.assertIn(value, default_cell.replace("`", ""),
                                          f"{name}/README.md: `{key}` defaults to {value} in the code")


if __name__ == "__main__":
    sys.exit(0 if unittest.main(exit=False).result.wasSuccessful() else 1)
