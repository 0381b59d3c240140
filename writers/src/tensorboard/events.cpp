#include "writers/src/tensorboard/events.h"

#include <cstring>

#include "event.pb.h"
#include "writers/src/tensorboard/crc32c.h"

namespace tensortap::detail::tb {
namespace {

namespace pb = ::tensortap::tb;

std::string serialized(const pb::Event& e) {
  std::string out;
  e.SerializeToString(&out);
  return out;
}

void put_le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFFu));
}

}  // namespace

std::string file_version_event(double wall_time) {
  pb::Event e;
  e.set_wall_time(wall_time);
  e.set_step(0);
  e.set_file_version("brain.Event:2");
  return serialized(e);
}

std::string scalars_event(double wall_time, std::int64_t step, const std::pair<std::string, float>* values,
                          std::size_t n) {
  // The most frequent event (one per statistics row): one message kept per
  // thread and cleared, which keeps its values' memory for the next.
  thread_local pb::Event e;
  e.Clear();
  e.set_wall_time(wall_time);
  e.set_step(step);
  pb::Summary* s = e.mutable_summary();
  for (std::size_t i = 0; i < n; ++i) {
    const auto& [tag, value] = values[i];
    pb::Summary::Value* v = s->add_value();
    v->set_tag(tag);
    v->set_simple_value(value);
  }
  return serialized(e);
}

std::string histogram_event(double wall_time, std::int64_t step, const std::string& tag, const Histogram& h) {
  pb::Event e;
  e.set_wall_time(wall_time);
  e.set_step(step);
  pb::Summary::Value* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  pb::HistogramProto* p = v->mutable_histo();
  p->set_min(h.min);
  p->set_max(h.max);
  p->set_num(h.num);
  p->set_sum(h.sum);
  p->set_sum_squares(h.sum_squares);
  for (double l : h.limits) p->add_bucket_limit(l);
  for (double c : h.counts) p->add_bucket(c);
  return serialized(e);
}

std::string text_event(double wall_time, std::int64_t step, const std::string& tag, const std::string& text) {
  pb::Event e;
  e.set_wall_time(wall_time);
  e.set_step(step);
  pb::Summary::Value* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
  pb::TensorProto* t = v->mutable_tensor();
  t->set_dtype(7);  // DT_STRING
  t->mutable_tensor_shape();
  t->add_string_val(text);
  return serialized(e);
}

std::string custom_scalars_event(double wall_time, const std::vector<LayoutCategory>& layout) {
  pb::Layout l;
  for (const LayoutCategory& category : layout) {
    pb::Category* c = l.add_category();
    c->set_title(category.title);
    for (const LayoutChart& chart : category.charts) {
      pb::Chart* ch = c->add_chart();
      ch->set_title(chart.title);
      for (const std::string& tag : chart.tags) ch->mutable_multiline()->add_tag(tag);
    }
  }
  pb::Event e;
  e.set_wall_time(wall_time);
  e.set_step(0);
  pb::Summary::Value* v = e.mutable_summary()->add_value();
  v->set_tag("custom_scalars__config__");
  v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("custom_scalars");
  pb::TensorProto* t = v->mutable_tensor();
  t->set_dtype(7);  // DT_STRING
  t->mutable_tensor_shape();
  t->add_string_val(l.SerializeAsString());
  return serialized(e);
}

void append_framed(std::string& out, const std::string& event) {
  std::string length;
  put_le(length, event.size(), 8);
  out += length;
  put_le(out, masked_crc32c(length.data(), length.size()), 4);
  out += event;
  put_le(out, masked_crc32c(event.data(), event.size()), 4);
}

}  // namespace tensortap::detail::tb
