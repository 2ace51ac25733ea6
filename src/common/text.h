// Parsing helpers for the text of settings (environment variables, specs).
#pragma once

#include <string>
#include <vector>

namespace gflow::text {

// `s` without leading and trailing spaces, tabs, CRs and LFs.
std::string trim(const std::string& s);

// The `sep`-separated items of `s`, each trimmed; empty items are dropped
// ("a, b,,c " gives a, b, c).
std::vector<std::string> splitList(const std::string& s, char sep = ',');

}  // namespace gflow::text
