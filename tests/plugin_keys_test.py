#!/usr/bin/env python3
"""plugin_keys_test.py — every plugin folder has a README whose "## Keys"
table lists exactly the keys the plugin reads.

A plugin folder is strategies/<name>/ or plugins/<name>/ (not common/ or
include/). The keys a plugin reads are the literal first arguments of its
config_int/config_float/config_bool/config_string calls, through the host
vtable or ddp::plugin::Host, in its own sources and in the strategies/common
headers they include (bucket_mb is read in common/bucket_cap.h). The README's
keys are the backquoted names in the first column of the table under
"## Keys"; a section that says "None" and has no table lists no key.

The engine reports at run time a key the plugin did not read as unknown;
this keeps the documentation of what it does read from drifting.
"""
import os
import re
import sys
import unittest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
READ_RE = re.compile(r'config_(?:int|float|bool|string)\s*\(\s*(?:[\w.>-]+\s*,\s*)?"(\w+)"')
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


def keys_read(folder):
    """Keys read by the sources of `folder` and the headers they include, transitively."""
    keys, seen = set(), set()
    todo = [os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(SOURCE)]
    while todo:
        path = os.path.normpath(todo.pop())
        if path in seen or not os.path.isfile(path):
            continue
        seen.add(path)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        keys.update(READ_RE.findall(text))
        todo += [os.path.join(os.path.dirname(path), inc) for inc in INCLUDE_RE.findall(text)]
    return keys


def keys_documented(readme):
    """The key names of the README's "## Keys" table; None if there is no such section."""
    with open(readme, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"^## Keys\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    if not m:
        return None
    rows = [line for line in m.group(1).split("\n") if line.startswith("|")]
    keys = set()
    for row in rows[2:]:  # past the header and the |---| line
        first = row.split("|")[1].strip()
        name = re.fullmatch(r"`(\w+)`", first)
        if name:
            keys.add(name.group(1))
    if not rows and not re.search(r"\bNone\b", m.group(1)):
        return None
    return keys


class PluginReadmes(unittest.TestCase):
    def test_the_scan_finds_what_the_plugins_are_known_to_read(self):
        # If this fails, READ_RE no longer matches how plugins read keys.
        self.assertEqual(keys_read(os.path.join(ROOT, "plugins", "gloo")), {"hostname", "algorithm"})
        self.assertEqual(keys_read(os.path.join(ROOT, "strategies", "bucketed")), {"bucket_mb", "overlap_optimizer"})
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


if __name__ == "__main__":
    sys.exit(0 if unittest.main(exit=False).result.wasSuccessful() else 1)
