// conformance_options.h — the command line of the conformance tool
// (conformance_test, installed as bin/ddp-conformance), where its data is,
// and the verdict it ends with. parse_conformance_args is pure and has its
// own test (conformance_options_test.cpp).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "nearest.h"

namespace ddp {

struct ConformanceOptions {
  std::string strategy = "naive";
  std::string transport = "gloo";
  std::string device = "cpu";              // run.device
  std::vector<std::string> strategy_keys;  // "key=value", values as ddp run --set takes them
  // [precision] of the run under test and of its reference: "compute=bf16"
  // (a bare word is a string; reduce applies to the run under test only).
  std::vector<std::string> precision_keys;
  std::optional<float> tolerance;          // parity tolerance the author declares; none: the scenarios'
  std::map<std::string, float> tolerance_for;  // per optimizer ("sgd", "adamw"): wins over `tolerance`
  std::vector<int> worlds = {1, 2, 3, 4};  // the world sizes the plugin runs on (--worlds); others skip
  bool help = false;

  // The tolerance for a scenario with `optimizer` whose own is `own`.
  float parity_tolerance(const std::string& optimizer, float own) const {
    const auto it = tolerance_for.find(optimizer);
    return it != tolerance_for.end() ? it->second : tolerance.value_or(own);
  }
  // "0.25" or "sgd=0.001, adamw=0.25" (as declared), for the report.
  std::string declared_tolerance() const;

  // The [precision] table of a case's TOML document ("" without
  // --precision): each key as given, a bare word quoted as ddp run --set
  // quotes it. The reference (`reference`: the single-process engine,
  // naive) leaves out `reduce`: one rank reduces nothing, and naive reduces
  // in float32 only.
  std::string precision_table(bool reference) const {
    std::string t;
    for (const std::string& kv : precision_keys) {
      const size_t at = kv.find('=');
      const std::string key = kv.substr(0, at);
      std::string value = kv.substr(at + 1);
      if (reference && key == "reduce") continue;
      const bool bare = !value.empty() && std::all_of(value.begin(), value.end(), [](char c) {
        return std::isalpha(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c));
      }) && !std::isdigit(static_cast<unsigned char>(value[0]));
      t += key + " = " + (bare ? "\"" + value + "\"" : value) + "\n";
    }
    return precision_keys.empty() ? "" : "[precision]\n" + t;
  }

  // The keys as --set overrides of the run under test.
  std::vector<std::string> strategy_sets() const {
    std::vector<std::string> sets;
    for (const std::string& kv : strategy_keys) sets.push_back("strategy." + kv);
    return sets;
  }
};

inline const char* kConformanceHelp =
    "usage: ddp-conformance [OPTIONS] [GoogleTest flags]\n"
    "\n"
    "The DDP conformance suite (docs/plugins.md) on a strategy plugin: toy models, worlds 1 to 4,\n"
    "each rank a process over the real transport, every step against the single-process engine\n"
    "or PyTorch-computed weights.\n"
    "\n"
    "  --strategy NAME|PATH      the strategy under test (default naive)\n"
    "  --strategy-key KEY=VALUE  a key of its [strategy] table, VALUE as ddp run --set takes it\n"
    "                            (TOML, or a bare word as a string); repeatable\n"
    "  --transport NAME|PATH     the transport (default gloo)\n"
    "  --device cpu|cuda         run.device (default cpu)\n"
    "  --precision KEY=VALUE     a key of [precision] (compute=bf16, reduce=bf16, loss_scale=none, ...)\n"
    "                            for the run and its reference, the single-process engine under the\n"
    "                            same compute (not the float32 PyTorch fixtures); repeatable\n"
    "  --tolerance T             parity tolerance for a lossy strategy (default: each scenario's,\n"
    "                            1e-6 SGD, 1e-5 AdamW); invariants are exact whatever it is\n"
    "  --tolerance OPT=T[,OPT=T] per optimizer (sgd, adamw): AdamW turns a gradient's rounding into\n"
    "                            lr-sized steps, SGD into rounding-sized ones; one not named keeps\n"
    "                            the plain --tolerance, else the scenario's\n"
    "  --worlds N[,N...]         the world sizes (1 to 4) the strategy runs on; cases of others skip\n"
    "                            with the reason, as do those its plan entry refuses with\n"
    "                            DDP_ERR_UNSUPPORTED (its own words); default 1,2,3,4\n"
    "  --help                    this text\n"
    "\n"
    "GoogleTest flags pass through (--gtest_filter='*_world2', --gtest_list_tests, ...).\n"
    "Failures are marked [invariant] (exact: ranks bitwise equal, collective sequences agree,\n"
    "buffers bounded, no allocation once settled, frozen parameters unchanged) or [parity]\n"
    "(against the reference, within the tolerance). The last line is the verdict.\n";


// --tolerance's value into `out`: a number >= 0, or sgd=T and adamw=T
// separated by commas. Returns "" or what is wrong. Pure.
inline std::string parse_tolerance(const std::string& value, ConformanceOptions* out) {
  const auto number = [](const std::string& text, float* t) {
    char* end = nullptr;
    *t = std::strtof(text.c_str(), &end);
    return !text.empty() && *end == '\0' && std::isfinite(*t) && *t >= 0;
  };
  float t = 0;
  if (value.find('=') == std::string::npos) {
    if (!number(value, &t)) return "--tolerance wants a number >= 0 or OPT=T[,OPT=T], got '" + value + "'";
    out->tolerance = t;
    return "";
  }
  for (size_t begin = 0; begin <= value.size();) {
    const size_t end = std::min(value.find(',', begin), value.size());
    const std::string item = value.substr(begin, end - begin);
    const size_t eq = item.find('=');
    const std::string opt = item.substr(0, eq);
    if (eq == std::string::npos || (opt != "sgd" && opt != "adamw") || !number(item.substr(eq + 1), &t))
      return "--tolerance: '" + item + "' is not sgd=T or adamw=T (T a number >= 0)";
    out->tolerance_for[opt] = t;
    begin = end + 1;
  }
  return "";
}

inline std::string ConformanceOptions::declared_tolerance() const {
  std::ostringstream out;
  if (tolerance) out << *tolerance;
  for (const auto& [opt, t] : tolerance_for) out << (out.tellp() > 0 ? ", " : "") << opt << "=" << t;
  return out.str();
}

// --worlds's value into `out`: world sizes 1 to 4, separated by commas,
// each once. Returns "" or what is wrong. Pure.
inline std::string parse_worlds(const std::string& value, ConformanceOptions* out) {
  std::vector<int> worlds;
  for (size_t begin = 0; begin <= value.size();) {
    const size_t end = std::min(value.find(',', begin), value.size());
    const std::string item = value.substr(begin, end - begin);
    if (item.size() != 1 || item[0] < '1' || item[0] > '4' ||
        std::find(worlds.begin(), worlds.end(), item[0] - '0') != worlds.end())
      return "--worlds wants world sizes from 1 to 4, each once, separated by commas; got '" + value + "'";
    worlds.push_back(item[0] - '0');
    begin = end + 1;
  }
  std::sort(worlds.begin(), worlds.end());
  out->worlds = worlds;
  return "";
}

// Fills `out` from `args` (argv without the program), GoogleTest's flags
// (--gtest_*) into `gtest`. Returns "" or what is wrong: an unknown option
// (with the nearest known one), a missing or malformed value. Pure.
inline std::string parse_conformance_args(const std::vector<std::string>& args, ConformanceOptions* out,
                                          std::vector<std::string>* gtest) {
  const std::vector<std::string> known = {"--strategy", "--strategy-key", "--transport", "--device", "--tolerance",
                                          "--worlds",   "--precision"};
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--gtest_", 0) == 0) {
      gtest->push_back(a);
      continue;
    }
    if (a == "--help" || a == "-h") {
      out->help = true;
      continue;
    }
    const size_t eq = a.find('=');
    const std::string flag = a.substr(0, eq);
    if (std::find(known.begin(), known.end(), flag) == known.end()) {
      const std::string nearest = nearest_name(flag, known);
      return "unknown option '" + a + "'" + (nearest.empty() ? "" : " (did you mean " + nearest + "?)") +
             "; ddp-conformance --help lists the options";
    }
    std::string value;
    if (eq != std::string::npos) {
      value = a.substr(eq + 1);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return flag + " needs a value";
    }
    if (flag == "--strategy") {
      out->strategy = value;
    } else if (flag == "--transport") {
      out->transport = value;
    } else if (flag == "--device") {
      out->device = value;
    } else if (flag == "--strategy-key") {
      const size_t at = value.find('=');
      if (at == std::string::npos || at == 0) return "--strategy-key wants KEY=VALUE, got '" + value + "'";
      out->strategy_keys.push_back(value);
    } else if (flag == "--precision") {
      const size_t at = value.find('=');
      if (at == std::string::npos || at == 0) return "--precision wants KEY=VALUE, got '" + value + "'";
      out->precision_keys.push_back(value);
    } else if (flag == "--worlds") {
      if (std::string why = parse_worlds(value, out); !why.empty()) return why;
    } else {  // --tolerance T, or OPT=T[,OPT=T]
      if (std::string why = parse_tolerance(value, out); !why.empty()) return why;
    }
  }
  return "";
}

// Where the suite's data (toy data, PyTorch fixtures) is: $DDP_CONFORMANCE_DATA,
// else share/ddp/conformance beside an installed bin/, else `built_in` (the
// source tree's tests/fixtures).
inline std::string conformance_data_dir(const std::string& built_in) {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("DDP_CONFORMANCE_DATA"); env && *env) return env;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path installed = exe.parent_path().parent_path() / "share" / "ddp" / "conformance";
    if (fs::exists(installed / "toy_data.safetensors", ec)) return installed.string();
  }
  return built_in;
}

// The one-line verdict at the end: how many cases ran, and in how many an
// invariant broke, parity was off, or the run itself failed.
class ConformanceVerdict : public testing::EmptyTestEventListener {
 public:
  explicit ConformanceVerdict(std::string what) : what_(std::move(what)) {}
  void OnTestStart(const testing::TestInfo&) override { invariant_ = parity_ = other_ = false; }
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (!r.failed()) return;
    const std::string m = r.message();
    (m.find("[invariant]") != std::string::npos ? invariant_
     : m.find("[parity]") != std::string::npos  ? parity_
                                                 : other_) = true;
  }
  void OnTestEnd(const testing::TestInfo& info) override {
    if (info.result()->Skipped()) {
      ++skipped_;
      return;
    }
    ++cases_;
    invariants_ += invariant_, parities_ += parity_, others_ += other_;
  }
  void OnTestProgramEnd(const testing::UnitTest&) override {
    const bool pass = invariants_ + parities_ + others_ == 0;
    std::cout << "ddp-conformance: " << (cases_ == 0 ? "NOTHING RAN" : pass ? "PASS" : "FAIL") << ": " << what_
              << ": " << cases_ << " case(s)";
    if (skipped_) std::cout << " (" << skipped_ << " skipped)";
    if (pass) {
      std::cout << ", every invariant and parity check held";
    } else {
      std::cout << "; invariants broken in " << invariants_ << ", parity off in " << parities_
                << ", other failures (the run itself) in " << others_;
    }
    std::cout << std::endl;
  }
  bool nothing_ran() const { return cases_ + skipped_ == 0; }
  // Several cases chose, each skipped: nothing of the strategy was checked
  // (one case alone is ctest's run of it, whose skip is its own verdict).
  bool all_of_several_skipped() const { return cases_ == 0 && skipped_ > 1; }

 private:
  std::string what_;
  bool invariant_ = false, parity_ = false, other_ = false;
  int cases_ = 0, skipped_ = 0, invariants_ = 0, parities_ = 0, others_ = 0;
};

}  // namespace ddp
