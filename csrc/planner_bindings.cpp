// Python face of the planner: chains go in as plain dicts, results come back as dicts, so that the Python side
// (memsave.recompute.planning) can build, store and print them without extra classes. Errors in a chain or schedule
// raise ValueError (from std::invalid_argument) or TypeError, naming the stage and field.
#include "planner_bindings.h"

#include <pybind11/stl.h>

#include <cmath>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "planner/simulate.h"
#include "planner/solver.h"

namespace py = pybind11;

namespace memsave {

namespace {

using planner::Chain;
using planner::Schedule;
using planner::Segment;
using planner::Skip;
using planner::Stage;

std::int64_t as_int(const py::handle& v, const std::string& where) {
  if (py::isinstance<py::bool_>(v) || !PyIndex_Check(v.ptr())) {
    throw py::type_error(where + " must be an int, got " + std::string(py::str(py::type::of(v).attr("__name__"))));
  }
  return py::cast<std::int64_t>(py::int_(py::reinterpret_borrow<py::object>(v)));
}

double as_float(const py::handle& v, const std::string& where) {
  if (py::isinstance<py::bool_>(v) ||
      !(PyFloat_Check(v.ptr()) || PyIndex_Check(v.ptr()) || py::hasattr(v, "__float__"))) {
    throw py::type_error(where + " must be a number, got " + std::string(py::str(py::type::of(v).attr("__name__"))));
  }
  return py::cast<double>(py::float_(py::reinterpret_borrow<py::object>(v)));
}

bool as_bool(const py::handle& v, const std::string& where) {
  if (!py::isinstance<py::bool_>(v)) throw py::type_error(where + " must be a bool");
  return v.cast<bool>();
}

void check_keys(const py::dict& d, const std::set<std::string>& allowed, const std::string& where) {
  for (const auto& item : d) {
    const std::string k = py::str(item.first);
    if (!allowed.count(k)) {
      std::string names;
      for (const std::string& a : allowed) names += (names.empty() ? "" : ", ") + a;
      throw py::value_error(where + ": unknown key '" + k + "'; allowed keys are " + names);
    }
  }
}

py::object required(const py::dict& d, const char* key, const std::string& where) {
  if (!d.contains(key)) throw py::value_error(where + ": missing required key '" + key + "'");
  return d[key];
}

// d[key] read element by element with `as` (an empty list when absent).
template <typename Read>
auto optional_list(const py::dict& d, const char* key, const std::string& where, Read as)
    -> std::vector<decltype(as(py::handle(), std::string()))> {
  std::vector<decltype(as(py::handle(), std::string()))> out;
  if (!d.contains(key)) return out;
  const std::string field = where + "['" + key + "']";
  const py::object v = d[key];
  if (!py::isinstance<py::sequence>(v) || py::isinstance<py::str>(v)) throw py::type_error(field + " must be a list");
  int k = 0;
  for (const py::handle& item : py::reinterpret_borrow<py::sequence>(v)) {
    out.push_back(as(item, field + "[" + std::to_string(k++) + "]"));
  }
  return out;
}

Stage parse_stage(const py::handle& obj, int i) {
  const std::string where = "chain['stages'][" + std::to_string(i) + "]";
  if (!py::isinstance<py::dict>(obj)) throw py::type_error(where + " must be a dict");
  const py::dict d = py::reinterpret_borrow<py::dict>(obj);
  check_keys(d,
             {"name",
              "fwd_time",
              "bwd_time",
              "input_bytes",
              "output_bytes",
              "input_passing_bytes",
              "output_passing_bytes",
              "input_grad_bytes",
              "output_grad_bytes",
              "saved_bytes",
              "transient_bytes",
              "fwd_transient_bytes",
              "bwd_transient_bytes",
              "param_grad_bytes",
              "checkpoint_bytes",
              "checkpoint_kept_bytes",
              "selective_fwd_time",
              "selective_kept_bytes",
              "tail_time",
              "selective_tail_time",
              "recomputable",
              "joins_previous"},
             where);
  auto field = [&](const char* k) { return where + "['" + k + "']"; };
  auto opt_int = [&](const char* k, std::int64_t dflt) { return d.contains(k) ? as_int(d[k], field(k)) : dflt; };
  Stage s;
  if (d.contains("name")) s.name = py::str(d["name"]);
  s.fwd_time = as_float(required(d, "fwd_time", where), field("fwd_time"));
  s.bwd_time = as_float(required(d, "bwd_time", where), field("bwd_time"));
  s.input_bytes = as_int(required(d, "input_bytes", where), field("input_bytes"));
  s.output_bytes = as_int(required(d, "output_bytes", where), field("output_bytes"));
  s.input_passing_bytes = opt_int("input_passing_bytes", 0);
  s.output_passing_bytes = opt_int("output_passing_bytes", 0);
  s.input_grad_bytes = opt_int("input_grad_bytes", s.input_bytes + s.input_passing_bytes);
  s.output_grad_bytes = opt_int("output_grad_bytes", s.output_bytes + s.output_passing_bytes);
  s.saved_bytes = opt_int("saved_bytes", 0);
  const std::int64_t transient = opt_int("transient_bytes", 0);
  s.fwd_transient_bytes = opt_int("fwd_transient_bytes", transient);
  s.bwd_transient_bytes = opt_int("bwd_transient_bytes", transient);
  s.param_grad_bytes = opt_int("param_grad_bytes", 0);
  s.checkpoint_bytes = opt_int("checkpoint_bytes", 0);
  s.checkpoint_kept_bytes = opt_int("checkpoint_kept_bytes", 0);
  if (d.contains("tail_time")) s.tail_time = as_float(d["tail_time"], field("tail_time"));
  s.selective_fwd_time = optional_list(d, "selective_fwd_time", where, as_float);
  s.selective_kept_bytes = optional_list(d, "selective_kept_bytes", where, as_int);
  s.selective_tail_time = optional_list(d, "selective_tail_time", where, as_float);
  if (d.contains("recomputable")) s.recomputable = as_bool(d["recomputable"], field("recomputable"));
  if (d.contains("joins_previous")) s.joins_previous = as_bool(d["joins_previous"], field("joins_previous"));
  return s;
}

Chain parse_chain(const py::dict& d) {
  check_keys(d, {"stages", "skips", "base_bytes", "segment_bytes", "recompute_bytes", "operator_classes"}, "chain");
  const py::object stages = required(d, "stages", "chain");
  if (!py::isinstance<py::sequence>(stages) || py::isinstance<py::str>(stages)) {
    throw py::type_error("chain['stages'] must be a list of dicts");
  }
  Chain c;
  int i = 0;
  for (const py::handle& s : stages) c.stages.push_back(parse_stage(s, i++));
  if (d.contains("skips")) {
    int k = 0;
    for (const py::handle& obj : d["skips"]) {
      const std::string where = "chain['skips'][" + std::to_string(k++) + "]";
      if (!py::isinstance<py::dict>(obj)) throw py::type_error(where + " must be a dict");
      const py::dict sd = py::reinterpret_borrow<py::dict>(obj);
      check_keys(sd, {"producer", "consumer", "bytes", "grad_bytes"}, where);
      Skip sk;
      sk.producer = static_cast<int>(as_int(required(sd, "producer", where), where + "['producer']"));
      sk.consumer = static_cast<int>(as_int(required(sd, "consumer", where), where + "['consumer']"));
      sk.bytes = as_int(required(sd, "bytes", where), where + "['bytes']");
      sk.grad_bytes = sd.contains("grad_bytes") ? as_int(sd["grad_bytes"], where + "['grad_bytes']") : sk.bytes;
      c.skips.push_back(sk);
    }
  }
  if (d.contains("base_bytes")) c.base_bytes = as_int(d["base_bytes"], "chain['base_bytes']");
  if (d.contains("segment_bytes")) c.segment_bytes = as_int(d["segment_bytes"], "chain['segment_bytes']");
  if (d.contains("recompute_bytes")) c.recompute_bytes = as_int(d["recompute_bytes"], "chain['recompute_bytes']");
  if (d.contains("operator_classes")) {
    const py::object names = d["operator_classes"];
    if (!py::isinstance<py::sequence>(names) || py::isinstance<py::str>(names)) {
      throw py::type_error("chain['operator_classes'] must be a list of str such as [\"matmul+attention\"]");
    }
    for (const py::handle& name : names) c.operator_classes.push_back(py::str(name));
  }
  c.validate();
  return c;
}

Schedule parse_segments(const py::handle& obj) {
  Schedule s;
  int k = 0;
  for (const py::handle& item : obj) {
    const std::string where = "segments[" + std::to_string(k++) + "]";
    const py::tuple t = py::reinterpret_borrow<py::object>(item).cast<py::tuple>();
    if (t.size() != 3 && t.size() != 4) {
      throw py::value_error(where + " must be (begin, end, recompute[, kept_classes])");
    }
    const int kept = t.size() == 4 && !t[3].is_none() ? static_cast<int>(as_int(t[3], where + "[3]")) : -1;
    s.push_back(Segment{static_cast<int>(as_int(t[0], where + "[0]")), static_cast<int>(as_int(t[1], where + "[1]")),
                        as_bool(t[2], where + "[2]"), kept});
  }
  return s;
}

py::list segments_to_py(const Schedule& s) {
  py::list out;
  for (const Segment& seg : s) out.append(py::make_tuple(seg.begin, seg.end, seg.recompute));
  return out;
}

// Per segment: the index in chain['operator_classes'] of the classes a selective segment keeps, or None (kept, or
// recomputed whole).
py::list kept_classes_to_py(const Schedule& s) {
  py::list out;
  for (const Segment& seg : s) {
    out.append(seg.kept_classes >= 0 ? py::object(py::int_(seg.kept_classes)) : py::object(py::none()));
  }
  return out;
}

py::dict plan_to_py(const planner::PlanResult& r) {
  py::dict d;
  d["strategy"] = r.strategy;
  d["chosen_from"] = r.chosen_from;
  d["segments"] = segments_to_py(r.segments);
  d["segment_kept_classes"] = kept_classes_to_py(r.segments);
  d["feasible"] = r.feasible;
  d["budget_bytes"] = r.budget_bytes == planner::kNoBudget ? py::object(py::none()) : py::int_(r.budget_bytes);
  d["predicted_peak_bytes"] = r.predicted_peak_bytes;
  d["predicted_extra_time"] = r.predicted_extra_time;
  d["eager_time"] = r.eager_time;
  d["min_feasible_bytes"] = r.min_feasible_bytes;
  d["no_checkpoint_peak_bytes"] = r.no_checkpoint_peak_bytes;
  d["slots"] = r.slots;
  d["slot_bytes"] = r.slot_bytes;
  return d;
}

py::dict solve(const py::dict& chain_dict, const std::optional<std::int64_t>& budget, const std::string& strategy,
               int slots) {
  const Chain chain = parse_chain(chain_dict);
  const std::int64_t b = budget ? *budget : planner::kNoBudget;
  planner::PlanResult r;
  {
    py::gil_scoped_release release;
    r = planner::plan(chain, b, strategy, slots);
  }
  return plan_to_py(r);
}

py::dict simulate(const py::dict& chain_dict, const py::object& segments, bool timeline) {
  const Chain chain = parse_chain(chain_dict);
  const Schedule s = parse_segments(segments);
  planner::SimResult r;
  {
    py::gil_scoped_release release;
    r = planner::simulate(chain, s, timeline);
  }
  py::dict d;
  d["peak_bytes"] = r.peak_bytes;
  d["peak_phase"] = planner::phase_name(r.peak_phase);
  d["peak_stage"] = r.peak_stage;
  d["extra_time"] = r.extra_time;
  d["end_bytes"] = r.end_bytes;
  if (timeline) {
    py::list t;
    for (const planner::Moment& m : r.timeline) {
      t.append(py::make_tuple(planner::phase_name(m.phase), m.stage, m.live_bytes));
    }
    d["timeline"] = t;
  }
  return d;
}

py::dict min_peak(const py::dict& chain_dict) {
  const Chain chain = parse_chain(chain_dict);
  const planner::MinPeakResult r = planner::min_peak(chain);
  py::dict d;
  d["segments"] = segments_to_py(r.segments);
  d["segment_kept_classes"] = kept_classes_to_py(r.segments);
  d["peak_bytes"] = r.peak_bytes;
  d["extra_time"] = r.extra_time;
  return d;
}

}  // namespace

void bind_planner(py::module_& m) {
  m.def("planner_solve", &solve, py::arg("chain"), py::arg("budget_bytes"), py::arg("strategy") = "optimal",
        py::arg("slots") = 500,
        R"doc(Plan which stages of a chain to checkpoint.

Args:
    chain: {"stages": [stage, ...], "skips": [skip, ...], "base_bytes": int, "segment_bytes": int,
        "recompute_bytes": int, "operator_classes": [str, ...]} (all but stages optional). A stage is a dict with
        fwd_time, bwd_time (numbers), input_bytes, output_bytes (ints) and optionally name, saved_bytes,
        transient_bytes (or fwd_transient_bytes / bwd_transient_bytes), input_passing_bytes, output_passing_bytes
        (boundary bytes no neighbour keeps for backward), input_grad_bytes, output_grad_bytes (default: the boundary
        sizes), param_grad_bytes, checkpoint_bytes (held while the stage is checkpointed), checkpoint_kept_bytes
        (held by a checkpointed stage from its forward until its recompute), recomputable, joins_previous, and its
        selective variants: selective_fwd_time and selective_kept_bytes, lists with one entry per operator_classes
        entry (or empty). segment_bytes are held by each checkpointed segment, recompute_bytes while it is
        recomputed. operator_classes: the operator-class sets a selective segment may keep, each "+"-joined (e.g.
        "matmul+attention"); a selective segment keeping set k keeps the outputs its stages' variant k keeps and
        recomputes the rest in selective_fwd_time[k].
        A stage's output boundary is the next stage's input: output_bytes[i] must equal input_bytes[i+1].
        A skip is {"producer": i, "consumer": j, "bytes": n, "grad_bytes": n (optional)} with i < j.
        See csrc/planner/chain.h for the exact memory model.
    budget_bytes: peak bytes the step may reach, or None for no budget.
    strategy: "optimal", "sqrt", "uniform:K", "none", "all" or "min_memory".
    slots: memory slots of the optimal solver's dynamic program (more = closer to exact, slower).

Returns:
    dict with segments (list of (begin, end_exclusive, recompute)), segment_kept_classes (per segment the index
    in operator_classes of the classes it keeps, or None: kept or recomputed whole), feasible, predicted_peak_bytes,
    predicted_extra_time, eager_time, min_feasible_bytes (smallest peak any schedule reaches),
    no_checkpoint_peak_bytes, budget_bytes, strategy, chosen_from, slots, slot_bytes.
    When no schedule fits, feasible is False and segments is the minimum-peak schedule.

Example:
    >>> stage = {"fwd_time": 1.0, "bwd_time": 2.0, "input_bytes": 10, "output_bytes": 10, "saved_bytes": 20}
    >>> memsave._C.planner_solve({"stages": [stage] * 4}, 100, "optimal")["segments"]
    [(0, 2, True), (2, 4, False)]
)doc");
  m.def("planner_simulate", &simulate, py::arg("chain"), py::arg("segments"), py::arg("timeline") = false,
        R"doc(Predict the peak memory of one training step of a chain under a given schedule.

Args:
    chain: as for planner_solve.
    segments: list of (begin, end_exclusive, recompute) or (begin, end_exclusive, recompute, kept_classes)
        covering all stages in order; kept_classes: index in the chain's operator_classes of the classes a
        selective segment keeps, or None / -1 for none.
    timeline: also return every moment as (phase, stage, live_bytes).

Returns:
    dict with peak_bytes, peak_phase ("forward", "backward_start", "recompute" or "backward"), peak_stage,
    extra_time (recompute time), end_bytes (live after the step) and, if asked, timeline.

Example:
    >>> memsave._C.planner_simulate({"stages": [stage] * 4}, [(0, 4, False)])["peak_bytes"]
    150
)doc");
  m.def("planner_min_peak", &min_peak, py::arg("chain"),
        R"doc(The smallest predicted peak over all schedules of a chain (exact, no discretisation).

Args:
    chain: as for planner_solve.

Returns:
    dict with peak_bytes, segments (a schedule reaching it), segment_kept_classes and extra_time (its recompute
    time).

Example:
    >>> memsave._C.planner_min_peak({"stages": [stage] * 4})["peak_bytes"]
    90
)doc");
  m.attr("planner_strategies") = py::make_tuple("optimal", "sqrt", "uniform:K", "none", "all", "min_memory");
}

}  // namespace memsave
