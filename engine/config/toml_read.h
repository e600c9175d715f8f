// toml_read.h — the TOML reading that config.cpp and plugin_section.cpp
// share (internal to engine/config): where a node came from, as the user
// names it ("<file>:<line>:<col>" or "--set <arg>"), type names and checks,
// and the --set overrides. Every failure is a ConfigError in the words
// config.h lists.
#pragma once

#include <string>

#include <toml++/toml.h>

#include "error.h"

namespace ddp::toml_read {

// Values from --set carry "--set <arg>" as their source path.
extern const char* const kSetPrefix;

const char* type_name(toml::node_type type);  // "an integer", "a float", ...
// An integer is an exact float, so it is accepted wherever a float is.
bool has_type(const toml::node& node, toml::node_type type);
bool from_override(const toml::source_region& source);
// "<file>:<line>:<col>", "--set <arg>", or `file` for a node built in code.
std::string where_of(const toml::source_region& source, const std::string& file);
ConfigError wrong_type(const std::string& where, const std::string& name, toml::node_type expected,
                       const toml::node& node);
std::string format_double(double value);  // as a user wrote it: "0.9", not "0.90000000000000002"
std::string trim(const std::string& s);

// The file parsed; a missing file or a parse error is a ConfigError.
toml::table parse_file(const std::string& path);
// Applies "section.key=value" (a TOML value; a bare word that is not valid
// TOML is taken as a string) to `doc`, its node sourced as "--set <arg>".
void apply_override(toml::table& doc, const std::string& arg);

}  // namespace ddp::toml_read
