#pragma once
// The planner's output: a text report that shows its work (every number with its formula) and
// the same as JSON.
#include <nlohmann/json.hpp>
#include <ostream>
#include <vector>

#include "longattn/plan/estimate.hpp"

namespace longattn::plan {

void print_inputs(std::ostream& out, const Plan& plan);
void print_estimate(std::ostream& out, const Estimate& estimate);
// One line per layout, fastest (or cheapest) first.
void print_ranking(std::ostream& out, const std::vector<Estimate>& ranked);

nlohmann::json to_json(const Plan& plan);
nlohmann::json to_json(const Estimate& estimate);

}  // namespace longattn::plan
