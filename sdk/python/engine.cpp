// tensortap._engine: the C++ recorder for Python (tensortap.torch.watch(...,
// engine="native")). Python's hooks decide names, repeats and the step's
// gradient sums, as the pure-Python writer does; the records go through the
// front end (snapshot on this thread, the copier, the writer thread), so a
// Python job gets what a C++ one has: packed and HDF5, statistics, the flight
// recorder and its rules, the budget, the watchdog, tensortap ctl and
// TensorBoard.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/extension.h>

#include <tensortap/error.h>
#include <tensortap/recorder.h>
#include <tensortap/trigger.h>

#include "sdk/src/front/front_end.h"
#include "sdk/src/sinks/option_table.h"
#include "writers/src/check.h"

namespace py = pybind11;

namespace tensortap::detail {
namespace {

Kind kind_named(const std::string& name) {
  for (Kind k : kAllKinds)
    if (name == kind_name(k)) return k;
  throw py::value_error("tensortap._engine: unknown kind '" + name +
                        "': one of activation, activation_grad, param, buffer, grad, tensor");
}

// A Python value as TENSORTAP_OPTIONS would spell it: the option table
// parses it, so the keys, the words and the refusals are the environment's.
std::string spelled(const std::string& key, const py::handle& value) {
  if (py::isinstance<py::bool_>(value)) return value.cast<bool>() ? "1" : "0";
  if (py::isinstance<py::int_>(value)) return std::to_string(value.cast<std::int64_t>());
  if (py::isinstance<py::str>(value)) return value.cast<std::string>();
  if (value.is_none() && key == "stop") return "none";
  if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value)) {
    std::string out;
    for (const py::handle& item : value) out += (out.empty() ? "" : "+") + spelled(key, item);
    return out;
  }
  throw py::type_error("tensortap._engine: option " + key + " = " + py::repr(value).cast<std::string>() +
                       ": expected an int, a bool, a string or a list of them");
}

Options options_of(const std::string& dir, const py::dict& given) {
  Options o(dir);
  for (const auto& [k, v] : given) {
    const std::string key = k.cast<std::string>();
    const OptionRow* row = option_row(key);
    if (row == nullptr) throw py::value_error("tensortap._engine: unknown option '" + key + "'");
    OptionText text{key, spelled(key, v), "tensortap.torch"};
    if (row->from_text == nullptr)
      throw py::value_error("tensortap._engine: option '" + key + "' cannot be given here: " + row->not_env);
    try {
      row->from_text(o, text);
    } catch (const std::exception& e) {
      throw py::value_error(e.what());
    }
  }
  return o;
}

// A recorder and its front end, as Python holds them.
class Engine {
 public:
  Engine(const std::string& dir, const py::dict& options)
      : recorder_(std::make_shared<Recorder>(options_of(dir, options))),
        front_(RecorderAccess::front_end(*recorder_)) {}

  void step(std::int64_t s) {
    py::gil_scoped_release release;
    recorder_->step(s);
  }
  // Whether a record of `kind` at the current step would be taken (full or
  // statistics): the hooks ask before they hand a tensor over.
  bool active(const std::string& kind) const { return front_->active(kind_named(kind)); }
  bool any_active() const {
    for (Kind k : kAllKinds)
      if (front_->active(k)) return true;
    return false;
  }
  // A record under a name Python gave (its repeat suffix included), at `step`.
  void record(const std::string& kind, const std::string& name, std::int64_t step, const at::Tensor& tensor) {
    const Kind k = kind_named(kind);
    // Overflow::Block may wait for the copier or the writer: without the GIL,
    // which a DataLoader's threads or a rule's Python code may want.
    py::gil_scoped_release release;
    try {
      front_->record_as(k, name, tensor, step);
    } catch (...) {
      // As a C++ hook: counted, and under OnError::Stop the next step() throws.
      front_->hook_failed(std::current_exception());
    }
  }
  void capture(const std::string& name, const at::Tensor& tensor) {
    py::gil_scoped_release release;
    recorder_->capture(name, tensor);
  }
  void add_taps(const std::vector<std::pair<std::string, std::string>>& taps) { front_->add_taps(taps); }
  void dump() { recorder_->dump(); }
  void flush() {
    py::gil_scoped_release release;
    recorder_->flush();
  }
  void close() {
    py::gil_scoped_release release;
    recorder_->close();
  }
  bool closed() const { return front_->closed(); }
  std::string path() const { return recorder_->run_dir(); }
  py::dict counters() const {
    const Counters c = recorder_->counters();
    py::dict d;
    d["records"] = c.records;
    d["bytes"] = c.bytes;
    d["dropped"] = c.dropped;
    d["errors"] = c.errors;
    d["budget_refused"] = c.budget_refused;
    return d;
  }

 private:
  std::shared_ptr<Recorder> recorder_;
  std::shared_ptr<FrontEnd> front_;
};

}  // namespace
}  // namespace tensortap::detail

PYBIND11_MODULE(_engine, m) {
  using tensortap::detail::Engine;
  m.doc() = "tensortap's C++ recorder for tensortap.torch.watch(..., engine='native')";
  // The library's errors (a bad option, a closed run, a full disk under
  // OnError::Stop) reach Python as RuntimeError with the C++ message.
  py::register_exception<tensortap::Error>(m, "Error", PyExc_RuntimeError);
  py::class_<Engine>(m, "Recorder")
      .def(py::init<const std::string&, const py::dict&>(), py::arg("dir"), py::arg("options"))
      .def("step", &Engine::step)
      .def("active", &Engine::active)
      .def("any_active", &Engine::any_active)
      .def("record", &Engine::record, py::arg("kind"), py::arg("name"), py::arg("step"), py::arg("tensor"))
      .def("capture", &Engine::capture)
      .def("add_taps", &Engine::add_taps)
      .def("dump", &Engine::dump)
      .def("flush", &Engine::flush)
      .def("close", &Engine::close)
      .def_property_readonly("closed", &Engine::closed)
      .def_property_readonly("path", &Engine::path)
      .def("counters", &Engine::counters);
}
