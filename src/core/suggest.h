// "Did you mean ...?" for names typed by users (flags, optimizer and scheduler names): edit distance.
#pragma once
#include <string>
#include <vector>

namespace tr {

// Levenshtein distance (insert, delete, substitute: cost 1 each).
size_t edit_distance(const std::string& a, const std::string& b);
// The candidate closest to `name` when it is close enough to be a plausible typo (distance at most a third
// of the longer name, at least 2), else "".
std::string nearest_name(const std::string& name, const std::vector<std::string>& candidates);
// " (did you mean 'x'?)" or "".
std::string did_you_mean(const std::string& name, const std::vector<std::string>& candidates);

}  // namespace tr
