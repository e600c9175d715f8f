#!/usr/bin/env python3
"""check_structure_test.py — tools/check_structure.py finds what it is for.

Each test writes a small tree (not a git checkout: the checker then reads
every file) with one violation, and checks that the checker names it, and
that a tree without one passes.
"""
import importlib.util
import os
import subprocess
import sys
import tempfile
import unittest
import importlib.util

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
CHECKER = os.path.join(ROOT, "tools", "check_structure.py")
_spec = importlib.util.spec_from_file_location("check_structure", CHECKER)
checker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(checker)

CLEAN = {
    "plugins/include/ddp/plugin.h": "#pragma once\n",
    "engine/core/error.h": '#pragma once\n#include <ddp/plugin.h>\n',
    "engine/models/model.h": '#pragma once\n#include "error.h"\n',
    "engine/models/layers.h": "#pragma once\n",
    "engine/core/env.cpp": '#include <cstdlib>\nconst char* v() {\n  return std::getenv("HOME");\n}\n',
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
        tree["engine/models/model.h"] = '#pragma once\n#include "config.h"\n'
        code, out = run(tree)
        self.assertEqual(code, 1)
        self.assertIn("engine/models/model.h:2: includes engine/config/config.h: engine/models/ may not depend on "
                      "engine/config/", out)

    def test_a_strategy_including_the_engine_is_a_layering_finding(self):
        tree = dict(CLEAN)
        tree["strategies/naive/naive.cpp"] = '#include "../../engine/core/error.h"\n'
        code, out = run(tree)
        self.assertEqual(code, 1)
        self.assertIn("strategies/naive/naive.cpp:1: includes engine/core/error.h", out)

    def test_an_angle_bracket_include_of_a_repository_header_is_checked_too(self):
        tree = dict(CLEAN)
        tree["engine/models/model.h"] = '#pragma once\n#include <config.h>\n'
        code, out = run(tree)
        self.assertIn("engine/models/model.h:2: includes engine/config/config.h", out)

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
        tree["engine/models/k.cuh"] = "int g() try {\n" + "  int x = 0;\n" * 90 + "} catch (...) {\n  return 1;\n}\n"
        code, out = run(tree)
        self.assertIn("engine/models/k.cuh:1: function g has 92 lines", out)

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

    def test_a_top_level_folder_using_the_engine_is_an_arrow_back_up(self):
        tree = dict(CLEAN)
        tree["models/model.h"] = '#pragma once\n#include "error.h"\n'
        code, out = run(tree)
        self.assertEqual(code, 1, out)
        self.assertIn("models/model.h:2: includes engine/core/error.h: an arrow back up between top-level folders: "
                      "models/ may not use engine/ (it may use: nothing)", out)
        self.assertIn("models/: a top-level folder of sources outside the layering", out)

    def test_a_transport_plugin_using_a_strategys_header_is_an_arrow_between_top_level_folders(self):
        tree = dict(CLEAN)
        tree["plugins/gloo/gloo.cpp"] = '#include "../../strategies/common/util.h"\n'
        code, out = run(tree)
        self.assertIn("plugins/gloo/gloo.cpp:1: includes strategies/common/util.h: an arrow back up between "
                      "top-level folders: plugins/ may not use strategies/ (it may use: plugins/include)", out)

    def test_a_layers_table_in_a_circle_or_pointing_up_is_a_finding(self):
        self.assertEqual(checker.layer_cycle({"engine/a": ["engine/b"], "engine/b": ["engine/c"],
                                              "engine/c": ["engine/a"]}),
                         ["engine/a", "engine/b", "engine/c", "engine/a"])
        self.assertIsNone(checker.layer_cycle(checker.LAYERS))
        findings = []
        with tempfile.TemporaryDirectory() as d:
            checker.check_top_layers(d, [], findings, layers={"engine/core": ["plugins/include", "models"],
                                                              "models": ["engine/core"]})
        self.assertIn("tools/check_structure.py: LAYERS runs in a circle: engine/core -> models -> engine/core",
                      findings)
        self.assertIn("tools/check_structure.py: LAYERS lets engine/core/ use models/: an arrow back up between "
                      "top-level folders (engine/ may use: plugins/include)", findings)
        findings = []
        with tempfile.TemporaryDirectory() as d:
            checker.check_top_layers(d, [], findings)
        self.assertEqual(findings, [])

    def test_the_config_or_the_trainer_including_a_models_layers_is_a_finding(self):
        tree = dict(CLEAN)
        tree["engine/config/config.cpp"] = '#include "config.h"\n#include "layers.h"\n'
        tree["engine/train/run_end.cpp"] = '#include "model.h"\n#include <layers.h>\n'
        tree["engine/blas/probe.cpp"] = '#include "layers.h"\n'
        code, out = run(tree)
        self.assertEqual(code, 1, out)
        self.assertIn("engine/config/config.cpp:2: includes engine/models/layers.h: engine/config/ sees a model "
                      "through model.h, registry.h, compute.h, blas_info.h, not its layers", out)
        self.assertIn("engine/train/run_end.cpp:2: includes engine/models/layers.h", out)
        self.assertNotIn("engine/train/run_end.cpp:1", out)
        self.assertNotIn("engine/blas/probe.cpp", out)  # the kernel choice measures the layers' GEMMs

    def test_getenv_outside_the_env_module_is_a_finding(self):
        tree = dict(CLEAN)
        tree["engine/train/trainer.cpp"] = ('#include <cstdlib>\n// not std::getenv("X") in a comment\n'
                                            'const char* s = "getenv";\n'
                                            'const char* t() {\n  return std::getenv("DDP_TRACE");\n}\n'
                                            'const char* u() {\n  return secure_getenv("HOME");\n}\n')
        code, out = run(tree)
        self.assertEqual(code, 1, out)
        self.assertIn("engine/train/trainer.cpp:5: reads the environment with getenv: the engine reads it once, in "
                      "engine/core/env.cpp (env().get(name), or a field of Env)", out)
        self.assertIn("engine/train/trainer.cpp:8: reads the environment with secure_getenv", out)
        self.assertNotIn("trainer.cpp:2", out)
        self.assertNotIn("trainer.cpp:3", out)
        self.assertNotIn("engine/core/env.cpp:", out)  # the env module reads it

    def test_an_engine_error_deriving_from_the_plugin_sdk_is_a_finding(self):
        tree = dict(CLEAN)
        tree["engine/core/error.h"] = ('#pragma once\n#include <ddp/plugin.h>\nnamespace ddp {\n'
                                       'class Error : public plugin::Failure {\n};\n'
                                       'struct Other final : std::runtime_error, public Failure {\n};\n'
                                       'class Fine : public std::runtime_error {\n};\n}\n')
        code, out = run(tree)
        self.assertEqual(code, 1, out)
        self.assertIn("engine/core/error.h:4: class Error derives from the plugin SDK (public plugin::Failure): the "
                      "engine's errors are its own, converted to a status at the ABI (host_guard)", out)
        self.assertIn("engine/core/error.h:6: class Other derives from the plugin SDK", out)
        self.assertNotIn("class Fine", out)


class CommaStatements(unittest.TestCase):
    """comma_statements: the lines where a comma joins statements or declarations."""

    def found(self, text):
        return checker.comma_statements(text)

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

    def test_a_plugin_finding_fails_and_an_engine_train_one_is_reported_only(self):
        tree = dict(CLEAN)
        tree["strategies/naive/naive.cpp"] = '#include "../common/util.h"\nvoid f() {\n  int a = 0, b = 0;\n}\n'
        tree["engine/train/trainer.cpp"] = '#include "config.h"\nvoid g() {\n  a = 1, b = 2;\n}\n'
        code, out = run(tree)
        self.assertEqual(code, 1, out)
        self.assertIn("strategies/naive/naive.cpp:3: a comma joins statements or declarations", out)
        self.assertIn("note (report-only, COMMA_RULE_REPORT_ONLY): engine/train/trainer.cpp:3: a comma joins", out)
        self.assertEqual(checker.COMMA_RULE_REPORT_ONLY, ("engine/train/", "engine/host/"))

    def test_a_report_only_finding_alone_passes(self):
        tree = dict(CLEAN)
        tree["engine/host/host.h"] = '#pragma once\n#include "error.h"\nstruct M {\n  int a, b;\n};\n'
        code, out = run(tree)
        self.assertEqual(code, 0, out)
        self.assertIn("note (report-only, COMMA_RULE_REPORT_ONLY): engine/host/host.h:4: a comma joins", out)

    def test_an_engine_finding_outside_train_and_host_fails(self):
        tree = dict(CLEAN)
        tree["engine/models/model.h"] = '#pragma once\n#include "error.h"\nstruct M {\n  int a, b;\n};\n'
        code, out = run(tree)
        self.assertEqual(code, 1, out)
        self.assertIn("engine/models/model.h:4: a comma joins statements or declarations", out)
        self.assertNotIn("note (report-only, COMMA_RULE_REPORT_ONLY): engine/models/model.h", out)


if __name__ == "__main__":
    sys.exit(0 if unittest.main(exit=False).result.wasSuccessful() else 1)
