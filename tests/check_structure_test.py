#!/usr/bin/env python3
"""check_structure_test.py — tools/check_structure.py finds what it is for.

Each test writes a small tree (not a git checkout: the checker then reads
every file) with one violation, and checks that the checker names it, and
that a tree without one passes.
"""
import os
import subprocess
import sys
import tempfile
import unittest
import importlib.util

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
CHECKER = os.path.join(ROOT, "tools", "check_structure.py")
_spec = importlib.util.spec_from_file_location("check_structure", CHECKER)
check_structure = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_structure)

CLEAN = {
    "plugins/include/ddp/plugin.h": "#pragma once\n",
    "engine/core/error.h": '#pragma once\n#include <ddp/plugin.h>\n',
    "models/model.h": '#pragma once\n#include "error.h"\n',
    "engine/config/config.h": '#pragma once\n#include "model.h"\n',
    "engine/train/trainer.cpp": '#include "config.h"\n#include "error.h"\nint f() {\n  return 1;\n}\n',
    "strategies/common/util.h": "#pragma once\n#include <ddp/plugin.h>\n",
    "strategies/naive/naive.cpp": '#include "../common/util.h"\n',
    "docs/a.md": "See [b](b.md) and `engine/core/error.h`.\n",
    "docs/b.md": "Back to [a](a.md#top).\n",
}


def run(tree):
    with tempfile.TemporaryDirectory() as d:
        for path, text in tree.items():
            os.makedirs(os.path.join(d, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(d, path), "w") as f:
                f.write(text)
        p = subprocess.run([sys.executable, CHECKER, "--root", d], capture_output=True, text=True)
        return p.returncode, p.stdout


class CheckStructure(unittest.TestCase):
    def test_a_clean_tree_passes(self):
        code, out = run(CLEAN)
        self.assertEqual(code, 0, out)
        self.assertIn("hold", out)

    def test_a_model_including_the_config_is_a_layering_finding(self):
        tree = dict(CLEAN)
        tree["models/model.h"] = '#pragma once\n#include "config.h"\n'
        code, out = run(tree)
        self.assertEqual(code, 1)
        self.assertIn("models/model.h:2: includes engine/config/config.h: models/ may not depend on engine/config/", out)

    def test_a_strategy_including_the_engine_is_a_layering_finding(self):
        tree = dict(CLEAN)
        tree["strategies/naive/naive.cpp"] = '#include "../../engine/core/error.h"\n'
        code, out = run(tree)
        self.assertEqual(code, 1)
        self.assertIn("strategies/naive/naive.cpp:1: includes engine/core/error.h", out)

    def test_an_angle_bracket_include_of_a_repository_header_is_checked_too(self):
        tree = dict(CLEAN)
        tree["models/model.h"] = '#pragma once\n#include <config.h>\n'
        code, out = run(tree)
        self.assertIn("models/model.h:2: includes engine/config/config.h", out)

    def test_an_include_of_a_test_header_is_a_finding_not_a_crash(self):
        tree = dict(CLEAN)
        tree["tests/harness.h"] = "#pragma once\n"
        tree["strategies/naive/naive.cpp"] = '#include "../../tests/harness.h"\n'
        code, out = run(tree)
        self.assertEqual(code, 1, out)
        self.assertIn("strategies/naive/naive.cpp:1: includes tests/harness.h", out)

    def test_a_folder_of_the_engine_outside_the_table_is_a_finding(self):
        tree = dict(CLEAN)
        tree["engine/extra/x.cpp"] = '#include "error.h"\n'
        code, out = run(tree)
        self.assertIn("engine/extra/: a folder of the engine that is not in the layering table", out)

    def test_cuda_headers_and_function_try_blocks_are_measured(self):
        tree = dict(CLEAN)
        tree["models/k.cuh"] = "int g() try {\n" + "  int x = 0;\n" * 90 + "} catch (...) {\n  return 1;\n}\n"
        code, out = run(tree)
        self.assertIn("models/k.cuh:1: function g has 92 lines", out)

    def test_a_file_over_its_budget_and_a_long_function_are_findings(self):
        tree = dict(CLEAN)
        tree["engine/train/big.cpp"] = "int g() {\n" + "  int x = 0;\n" * 90 + "  return 0;\n}\n" + "\n" * 420
        code, out = run(tree)
        self.assertEqual(code, 1)
        self.assertIn("engine/train/big.cpp:1: function g has 93 lines (at most 80)", out)
        self.assertIn("over the budget of 500 for engine/", out)

    def test_a_long_python_function_is_a_finding_but_not_in_tests(self):
        body = "def h():\n" + "    x = 1\n" * 85
        tree = dict(CLEAN, **{"tools/t.py": body, "tests/t_test.py": body})
        code, out = run(tree)
        self.assertIn("tools/t.py:1: function h has 86 lines", out)
        self.assertNotIn("tests/t_test.py", out)

    def test_paths_outside_or_missing_are_findings(self):
        tree = dict(CLEAN)
        outside = "../" + "shared/spec"  # spelt apart, or this file would be the checker's finding
        tree["docs/a.md"] = (f"From {outside}/models.md; see `engine/gone.h` and [c](c.md), "
                             "[up](../../etc/passwd).\n")
        code, out = run(tree)
        self.assertEqual(code, 1)
        self.assertIn("docs/a.md:1: refers to a path outside the repository", out)
        self.assertIn("docs/a.md:1: names engine/gone.h, which is not in the repository", out)
        self.assertIn("docs/a.md:1: links to c.md, which is not in the repository", out)
        self.assertIn("docs/a.md:1: links to ../../etc/passwd, which is not in the repository", out)

    def test_a_relative_path_that_climbs_out_is_a_finding_and_one_inside_is_not(self):
        tree = dict(CLEAN)
        tree["docs/a.md"] = "Data: `../tests/x.bin`; notes in ../../other-repo/notes.txt.\n"
        tree["tests/x.bin"] = ""
        code, out = run(tree)
        self.assertIn("docs/a.md:1: refers to a path outside the repository: ../../other-repo/notes.txt", out)
        self.assertNotIn("../tests/x.bin", out)


class CommaStatements(unittest.TestCase):
    """comma_statements: the lines where a comma joins statements or declarations."""

    def found(self, text):
        return check_structure.comma_statements(text)

    def test_joined_statements_and_declaration_lists_are_found(self):
        text = ("void f() {\n"
                "  a = 1, b = 2;\n"            # 2: assignments
                "  g(), h();\n"                # 3: calls
                "  x++, y++;\n"                # 4: increments outside a for header
                "  int c = 0, d = 0;\n"        # 5: a declaration list
                "  if (a) b = 1, c = 2;\n"     # 6: under a condition
                "  std::vector<int> v(3), w;\n"  # 7: declarators after a template type
                "  Foo e{1}, f{2};\n"          # 8: braced declarators
                "}\n"
                "struct S {\n"
                "  std::string p_, q_;\n"      # 11: members
                "};\n"
                "auto l = [] {\n"
                "  return a = 1, b;\n"         # 14: in a lambda's body
                "};\n"
                "int r = call(1, [&] {\n"
                "  m = 1, n = 2;\n"            # 17: in a lambda passed to a call
                "});\n"
                "x = 1,\n"
                "    y = 2;\n")               # 19: the line of the first comma
        self.assertEqual(self.found(text), [2, 3, 4, 5, 6, 7, 8, 11, 14, 17, 19])

    def test_commas_that_join_no_statements_are_not_found(self):
        text = ("#include <map>\n"
                "#define PAIR(a, b) \\\n"
                "  a = 1, b = 2;\n"                              # a macro's body, continued
                "template <typename A, typename B>\n"            # template parameters
                "struct P : public A, public B {\n"              # base classes
                "  P(int x, int y) : a_(x), b_{y} {}\n"          # parameters, initialiser list
                "  std::map<int, std::vector<int>> m_;\n"        # template arguments
                "};\n"
                "enum class E { kA, kB, kC };\n"                 # enumerators
                "const int kArr[] = {1, 2, 3};\n"                # an initialiser list
                "void f(int a, int b) {\n"
                "  for (int i = 0, j = 0; i < a; ++i, ++j) g(i, j);\n"  # a for header, a call
                "  PAIR(a, b);\n"                                # a macro's arguments
                "  std::pair<int, int> p{1, 2};\n"               # template and brace arguments
                "  auto [x, y] = p;\n"                           # a structured binding
                "  s = \"a, b\";  // c = 1, d = 2;\n"             # a string, a comment
                "  /* e = 1, f = 2; */ ch = ',';\n"              # a block comment, a character
                "  return {a, b};\n"                             # a braced return
                "}\n"
                "Entry e = {.a = 1, .b = 2};\n"                  # designated initialisers
                "namespace n { void h(std::function<void(int, int)> k); }\n")
        self.assertEqual(self.found(text), [])

    def test_a_plugin_finding_fails_and_an_engine_one_is_reported_only(self):
        tree = dict(CLEAN)
        tree["strategies/naive/naive.cpp"] = '#include "../common/util.h"\nvoid f() {\n  int a = 0, b = 0;\n}\n'
        tree["engine/train/trainer.cpp"] = '#include "config.h"\nvoid g() {\n  a = 1, b = 2;\n}\n'
        code, out = run(tree)
        self.assertEqual(code, 1, out)
        self.assertIn("strategies/naive/naive.cpp:3: a comma joins statements or declarations", out)
        self.assertIn("note (report-only, COMMA_RULE_REPORT_ONLY): engine/train/trainer.cpp:3: a comma joins", out)
        self.assertEqual(check_structure.COMMA_RULE_REPORT_ONLY, ("engine/", "models/"))

    def test_a_report_only_finding_alone_passes(self):
        tree = dict(CLEAN)
        tree["models/model.h"] = '#pragma once\n#include "error.h"\nstruct M {\n  int a, b;\n};\n'
        code, out = run(tree)
        self.assertEqual(code, 0, out)
        self.assertIn("note (report-only, COMMA_RULE_REPORT_ONLY): models/model.h:4: a comma joins", out)


if __name__ == "__main__":
    sys.exit(0 if unittest.main(exit=False).result.wasSuccessful() else 1)
