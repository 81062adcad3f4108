// SimDriver: streams, events, copies and enqueue_access: everything that puts
// work on a stream or waits for it. The hazard bookkeeping they share is in
// sim_hazards.cpp.
#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "sim_state.hpp"

namespace gvm::vmm {
namespace {

// Fake handle values: recognisable in a debugger, never 0, 0x1 or 0x2 (the
// legacy and per-thread default streams).
constexpr std::uintptr_t kStreamHandleBase = 0x5700'0000'0000;
constexpr std::uintptr_t kEventHandleBase = 0xe700'0000'0000;
// Copies with backing move data through a bounce buffer of this size, so a
// large copy does not double its host memory.
constexpr std::size_t kCopyChunk = std::size_t{1} << 20;

bool allows(Access a, AccessKind k) noexcept {
  return k == AccessKind::read ? (a == Access::read || a == Access::read_write)
                               : a == Access::read_write;
}

std::string hex(std::uintptr_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%" PRIxPTR, v);
  return buf;
}

}  // namespace

// --- state helpers ----------------------------------------------------------------

std::uint64_t SimDriver::State::add_stream(int device, bool legacy) {
  std::uint64_t id = next_object++;
  sim::Stream& s = streams[id];
  s.id = id;
  s.device = device;
  s.legacy = legacy;
  if (!legacy) {
    // The real driver hands a destroyed stream's handle out again; the most
    // recently destroyed first, as its allocator of stream objects does.
    if (!free_stream_handles.empty()) {
      s.handle = free_stream_handles.back();
      free_stream_handles.pop_back();
      dead_streams.erase(s.handle);
    } else {
      s.handle = reinterpret_cast<StreamHandle>(kStreamHandleBase + next_stream_handle++ * 0x100);
    }
    stream_ids[s.handle] = id;
  }
  return id;
}

void SimDriver::State::report_misuse(std::string what) {
  ++misuse_total;
  if (misuse.size() < sim::kMaxMisuseReports) misuse.push_back(std::move(what));
}

Result SimDriver::State::find_stream(Call c, int device, StreamHandle h, sim::Stream** out) {
  *out = nullptr;
  auto raw = reinterpret_cast<std::uintptr_t>(h);
  if (raw <= 2) {
    if (!valid_device(device)) return Result::invalid_device;
    *out = &streams.at(devices[static_cast<std::size_t>(device)].legacy_stream);
    return Result::success;
  }
  if (auto it = stream_ids.find(h); it != stream_ids.end()) {
    *out = &streams.at(it->second);
    return Result::success;
  }
  auto dead = dead_streams.find(h);
  if (dead == dead_streams.end()) return Result::invalid_handle;
  report_misuse(std::string(call_name(c)) + " on stream " + hex(raw) + " of device " +
                std::to_string(dead->second.device) +
                ", destroyed by cuStreamDestroy and not created again: undefined in the real "
                "driver (an H200 answered CUDA_ERROR_CONTEXT_IS_DESTROYED; a process has "
                "crashed inside the driver)");
  return die(Result::context_is_destroyed);
}

sim::Event* SimDriver::State::find_event(EventHandle e) {
  auto it = events.find(e);
  return it == events.end() ? nullptr : &it->second;
}

SimDriver::State::Reach SimDriver::State::resolve(DevicePtr lo, std::size_t n, int accessor,
                                                  AccessKind kind, Staging staging,
                                                  std::vector<sim::Segment>* out) {
  out->clear();
  if (n == 0) return Reach::ok;
  if (lo > ~DevicePtr{0} - n) return Reach::unmapped;
  const DevicePtr end = lo + n;
  DevicePtr cur = lo;
  while (cur < end) {
    auto m = mappings.upper_bound(cur);
    if (m != mappings.begin() && std::prev(m)->first + std::prev(m)->second.size > cur) {
      --m;
      sim::Phys& p = phys.at(m->second.handle);
      int who = accessor;
      if (!allows(m->second.access[static_cast<std::size_t>(accessor)], kind)) {
        if (staging != Staging::any ||
            !allows(m->second.access[static_cast<std::size_t>(p.device)], kind))
          return Reach::unreachable;
        who = p.device;
      }
      DevicePtr stop = std::min(end, m->first + m->second.size);
      out->push_back({cur, stop, p.device, who, &p.storage, cur - m->first});
      cur = stop;
      continue;
    }
    auto c = classic.upper_bound(cur);
    if (c != classic.begin() && std::prev(c)->first + std::prev(c)->second.size > cur) {
      --c;
      sim::Classic& a = c->second;
      int who = accessor;
      if (accessor != a.device && !devices[static_cast<std::size_t>(accessor)]
                                       .peer_enabled[static_cast<std::size_t>(a.device)]) {
        if (staging == Staging::none) return Reach::unreachable;
        who = a.device;
      }
      DevicePtr stop = std::min(end, c->first + a.size);
      out->push_back({cur, stop, a.device, who, &a.storage, cur - c->first});
      cur = stop;
      continue;
    }
    return Reach::unmapped;
  }
  return Reach::ok;
}

namespace {
// Calls fn(segment, offset in its storage, offset in the range, length) for
// the pieces of bytes [offset, offset + n) of the range `segs` describes.
template <class Fn>
void for_pieces(const std::vector<sim::Segment>& segs, std::size_t offset, std::size_t n, Fn fn) {
  std::size_t seg_start = 0;
  for (const sim::Segment& s : segs) {
    std::size_t len = s.hi - s.lo;
    std::size_t seg_end = seg_start + len;
    if (offset < seg_end && offset + n > seg_start) {
      std::size_t from = std::max(offset, seg_start);
      std::size_t to = std::min(offset + n, seg_end);
      fn(s, s.offset + (from - seg_start), from - offset, to - from);
    }
    seg_start = seg_end;
  }
}
}  // namespace

void SimDriver::State::read(const std::vector<sim::Segment>& segs, std::size_t offset, void* dst,
                            std::size_t n) {
  auto* out = static_cast<unsigned char*>(dst);
  for_pieces(segs, offset, n,
             [&](const sim::Segment& s, std::size_t at, std::size_t pos, std::size_t len) {
               s.storage->read(at, out + pos, len);
             });
}

void SimDriver::State::write(const std::vector<sim::Segment>& segs, std::size_t offset,
                             const void* src, std::size_t n) {
  const auto* in = static_cast<const unsigned char*>(src);
  for_pieces(segs, offset, n,
             [&](const sim::Segment& s, std::size_t at, std::size_t pos, std::size_t len) {
               s.storage->write(at, in + pos, len);
             });
}

namespace {
std::vector<SimDriver::State::Touch> touches(const std::vector<sim::Segment>& segs, AccessKind kind,
                                             std::vector<SimDriver::State::Touch> acc = {}) {
  for (const sim::Segment& s : segs) acc.push_back({s, kind});
  return acc;
}

// A device-to-device copy of `bytes` between two resolved ranges.
void copy_data(SimDriver::State& s, const std::vector<sim::Segment>& dst,
               const std::vector<sim::Segment>& src, std::size_t bytes) {
  std::vector<unsigned char> buf(std::min(bytes, kCopyChunk));
  for (std::size_t off = 0; off < bytes; off += buf.size()) {
    std::size_t len = std::min(buf.size(), bytes - off);
    s.read(src, off, buf.data(), len);
    s.write(dst, off, buf.data(), len);
  }
}
}  // namespace

// --- streams ------------------------------------------------------------------------

Result SimDriver::stream_create(int device, StreamHandle* stream) {
  GVM_SIM_ENTER(stream_create);
  if (!s_->valid_device(device)) return Result::invalid_device;
  if (stream == nullptr) return Result::invalid_value;
  GVM_SIM_CAPTURE(stream_create, {device, nullptr, nullptr});
  *stream = s_->streams.at(s_->add_stream(device, false)).handle;
  return Result::success;
}

Result SimDriver::stream_destroy(int device, StreamHandle stream) {
  GVM_SIM_ENTER(stream_destroy);
  if (!s_->valid_device(device)) return Result::invalid_device;
  GVM_SIM_STREAM(stream_destroy, s, device, stream);
  if (s->legacy) return Result::invalid_handle;  // the legacy stream is not ours to destroy
  GVM_SIM_CAPTURE(stream_destroy, {device, s, nullptr});
  s->destroyed = true;
  s_->stream_ids.erase(stream);
  s_->free_stream_handles.push_back(stream);
  s_->dead_streams[stream] = {s->device, s->id};
  s_->prune_streams();
  return Result::success;
}

Result SimDriver::stream_synchronize(int device, StreamHandle stream) {
  GVM_SIM_ENTER(stream_synchronize);
  if (!s_->valid_device(device)) return Result::invalid_device;
  GVM_SIM_STREAM(stream_synchronize, s, device, stream);
  GVM_SIM_CAPTURE(stream_synchronize, {device, s, nullptr});
  sim::VectorClock clock = s->clock;  // complete() may prune streams
  s_->complete(clock);
  return Result::success;
}

Result SimDriver::stream_get_id(int device, StreamHandle stream, std::uint64_t* id) {
  GVM_SIM_ENTER(stream_get_id);
  if (!s_->valid_device(device)) return Result::invalid_device;
  GVM_SIM_STREAM(stream_get_id, s, device, stream);
  if (id == nullptr) return Result::invalid_value;
  GVM_SIM_CAPTURE(stream_get_id, {device, s, nullptr});
  *id = s->id;
  return Result::success;
}

Result SimDriver::stream_wait_event(int device, StreamHandle stream, EventHandle event) {
  GVM_SIM_ENTER(stream_wait_event);
  if (!s_->valid_device(device)) return Result::invalid_device;
  GVM_SIM_STREAM(stream_wait_event, s, device, stream);
  sim::Event* e = s_->find_event(event);
  if (e == nullptr) return Result::invalid_handle;
  GVM_SIM_CAPTURE(stream_wait_event, {device, s, e});
  if (e->capture != 0) {
    // An event recorded inside a capture: the waiting stream joins that
    // capture (a fork), as in the real driver; nothing runs.
    if (s->capture == 0) s->capture = e->capture;
    return Result::success;
  }
  bool captured = false;
  if (Result r = s_->capture_work(*s, &captured); r != Result::success) return r;
  // Waiting for an event never recorded waits for nothing, as in CUDA.
  if (e->recorded && !captured) {
    for (const auto& [id, seq] : e->clock) {
      std::uint64_t& mine = s->clock[id];
      mine = std::max(mine, seq);
    }
  }
  return Result::success;
}

// --- events -------------------------------------------------------------------------

Result SimDriver::event_create(int device, EventHandle* event) {
  GVM_SIM_ENTER(event_create);
  if (!s_->valid_device(device)) return Result::invalid_device;
  if (event == nullptr) return Result::invalid_value;
  GVM_SIM_CAPTURE(event_create, {device, nullptr, nullptr});
  auto h = reinterpret_cast<EventHandle>(kEventHandleBase + s_->next_object++ * 0x100);
  s_->events[h].device = device;
  *event = h;
  return Result::success;
}

Result SimDriver::event_destroy(EventHandle event) {
  GVM_SIM_ENTER(event_destroy);
  sim::Event* e = s_->find_event(event);
  if (e == nullptr) return Result::invalid_handle;
  GVM_SIM_CAPTURE(event_destroy, {e->device, nullptr, e});
  s_->events.erase(event);
  return Result::success;
}

Result SimDriver::event_record(int device, EventHandle event, StreamHandle stream) {
  GVM_SIM_ENTER(event_record);
  if (!s_->valid_device(device)) return Result::invalid_device;
  GVM_SIM_STREAM(event_record, s, device, stream);
  sim::Event* e = s_->find_event(event);
  // Event and stream must belong to the same device (context).
  if (e == nullptr || e->device != s->device) return Result::invalid_handle;
  GVM_SIM_CAPTURE(event_record, {device, s, e});
  bool captured = false;
  if (Result r = s_->capture_work(*s, &captured); r != Result::success) return r;
  if (captured) {
    e->capture = s->capture;
    e->recorded = true;
    return Result::success;
  }
  e->capture = 0;
  e->clock = s->clock;
  e->recorded = true;
  return Result::success;
}

Result SimDriver::event_query(EventHandle event) {
  GVM_SIM_ENTER(event_query);
  sim::Event* e = s_->find_event(event);
  if (e == nullptr) return Result::invalid_handle;
  GVM_SIM_CAPTURE(event_query, {e->device, nullptr, e});
  if (!e->recorded || s_->is_complete(e->clock)) return Result::success;
  if (!s_->auto_complete) return Result::not_ready;
  sim::VectorClock clock = e->clock;
  s_->complete(clock);
  return Result::success;
}

Result SimDriver::event_synchronize(EventHandle event) {
  GVM_SIM_ENTER(event_synchronize);
  sim::Event* e = s_->find_event(event);
  if (e == nullptr) return Result::invalid_handle;
  GVM_SIM_CAPTURE(event_synchronize, {e->device, nullptr, e});
  if (e->recorded) {
    sim::VectorClock clock = e->clock;
    s_->complete(clock);
  }
  return Result::success;
}

// --- work on streams ---------------------------------------------------------------

Result SimDriver::enqueue_access(int device, StreamHandle stream, DevicePtr addr, std::size_t bytes,
                                 AccessKind kind) {
  std::lock_guard lock(s_->mu);
  if (s_->sticky != Result::success) return s_->sticky;
  if (!s_->valid_device(device)) return Result::invalid_device;
  GVM_SIM_STREAM(launch_kernel, s, device, stream);
  if (s->device != device) return Result::invalid_handle;
  if (bytes == 0 || (kind != AccessKind::read && kind != AccessKind::write))
    return Result::invalid_value;
  bool captured = false;
  if (Result r = s_->capture_work(*s, &captured); r != Result::success || captured) return r;
  std::vector<sim::Segment> segs;
  if (s_->resolve(addr, bytes, device, kind, State::Staging::none, &segs) != State::Reach::ok)
    return s_->die(Result::illegal_address);
  s_->enqueue(*s, touches(segs, kind), "kernel");
  return Result::success;
}

Result SimDriver::memcpy_async(int device, DevicePtr dst, DevicePtr src, std::size_t bytes,
                               StreamHandle stream) {
  GVM_SIM_ENTER(memcpy_async);
  if (!s_->valid_device(device)) return Result::invalid_device;
  GVM_SIM_STREAM(memcpy_async, s, device, stream);
  if (s->device != device) return Result::invalid_handle;
  if (bytes == 0) return Result::success;
  GVM_SIM_CAPTURE(memcpy_async, {device, s, nullptr});
  std::vector<sim::Segment> from, to;
  const State::Reach r_from =
      s_->resolve(src, bytes, device, AccessKind::read, State::Staging::classic, &from);
  const State::Reach r_to =
      s_->resolve(dst, bytes, device, AccessKind::write, State::Staging::classic, &to);
  if (r_from == State::Reach::unmapped || r_to == State::Reach::unmapped)
    return s_->die(Result::illegal_address);
  // VMM memory the stream's device was not granted: the real driver refuses
  // the copy (seen through PyTorch as cudaErrorInvalidValue) and does not
  // stage it; cuMemcpyPeerAsync would.
  if (r_from != State::Reach::ok || r_to != State::Reach::ok) return Result::invalid_value;
  bool captured = false;
  if (Result r = s_->capture_work(*s, &captured); r != Result::success || captured) return r;
  if (s_->backing) copy_data(*s_, to, from, bytes);
  s_->enqueue(*s, touches(to, AccessKind::write, touches(from, AccessKind::read)), "cuMemcpyAsync");
  return Result::success;
}

Result SimDriver::memcpy_peer_async(DevicePtr dst, int dst_device, DevicePtr src, int src_device,
                                    std::size_t bytes, StreamHandle stream) {
  GVM_SIM_ENTER(memcpy_peer_async);
  if (!s_->valid_device(dst_device) || !s_->valid_device(src_device)) return Result::invalid_device;
  GVM_SIM_STREAM(memcpy_peer_async, s, dst_device, stream);
  // The interface's contract: a stream of dst_device (nullptr: its legacy one).
  if (s->device != dst_device) return Result::invalid_handle;
  if (bytes == 0) return Result::success;
  GVM_SIM_CAPTURE(memcpy_peer_async, {dst_device, s, nullptr});
  // dst_device drives the copy, through peer access where it has it and
  // staged through the owner where it does not.
  std::vector<sim::Segment> from, to;
  if (s_->resolve(src, bytes, dst_device, AccessKind::read, State::Staging::any, &from) !=
          State::Reach::ok ||
      s_->resolve(dst, bytes, dst_device, AccessKind::write, State::Staging::any, &to) !=
          State::Reach::ok) {
    return s_->die(Result::illegal_address);
  }
  bool captured = false;
  if (Result r = s_->capture_work(*s, &captured); r != Result::success || captured) return r;
  if (s_->backing) copy_data(*s_, to, from, bytes);
  s_->enqueue(*s, touches(to, AccessKind::write, touches(from, AccessKind::read)),
              "cuMemcpyPeerAsync");
  return Result::success;
}

Result SimDriver::memcpy_htod(int device, DevicePtr dst, const void* src, std::size_t bytes) {
  GVM_SIM_ENTER(memcpy_htod);
  if (!s_->valid_device(device)) return Result::invalid_device;
  if (bytes == 0) return Result::success;
  std::vector<sim::Segment> to;
  if (src == nullptr || s_->resolve(dst, bytes, device, AccessKind::write, State::Staging::any,
                                    &to) != State::Reach::ok) {
    return Result::invalid_value;
  }
  GVM_SIM_CAPTURE(memcpy_htod, {device, nullptr, nullptr});
  if (s_->backing) s_->write(to, 0, src, bytes);
  sim::Stream& legacy = s_->streams.at(s_->devices[static_cast<std::size_t>(device)].legacy_stream);
  s_->enqueue(legacy, touches(to, AccessKind::write), "cuMemcpyHtoD");
  sim::VectorClock clock = legacy.clock;
  s_->complete(clock);
  return Result::success;
}

Result SimDriver::memcpy_dtoh(int device, void* dst, DevicePtr src, std::size_t bytes) {
  GVM_SIM_ENTER(memcpy_dtoh);
  if (!s_->valid_device(device)) return Result::invalid_device;
  if (bytes == 0) return Result::success;
  std::vector<sim::Segment> from;
  if (dst == nullptr || s_->resolve(src, bytes, device, AccessKind::read, State::Staging::any,
                                    &from) != State::Reach::ok) {
    return Result::invalid_value;
  }
  GVM_SIM_CAPTURE(memcpy_dtoh, {device, nullptr, nullptr});
  if (s_->backing) {
    s_->read(from, 0, dst, bytes);
  } else {
    std::memset(dst, 0, bytes);
  }
  sim::Stream& legacy = s_->streams.at(s_->devices[static_cast<std::size_t>(device)].legacy_stream);
  s_->enqueue(legacy, touches(from, AccessKind::read), "cuMemcpyDtoH");
  sim::VectorClock clock = legacy.clock;
  s_->complete(clock);
  return Result::success;
}

Result SimDriver::memset_d8_async(int device, DevicePtr dst, unsigned char value, std::size_t bytes,
                                  StreamHandle stream) {
  GVM_SIM_ENTER(memset_d8_async);
  if (!s_->valid_device(device)) return Result::invalid_device;
  GVM_SIM_STREAM(memset_d8_async, s, device, stream);
  if (s->device != device) return Result::invalid_handle;
  if (bytes == 0) return Result::success;
  GVM_SIM_CAPTURE(memset_d8_async, {device, s, nullptr});
  bool captured = false;
  if (Result r = s_->capture_work(*s, &captured); r != Result::success || captured) return r;
  std::vector<sim::Segment> to;
  // A memset is a kernel on `device`: no staging.
  if (s_->resolve(dst, bytes, device, AccessKind::write, State::Staging::none, &to) !=
      State::Reach::ok) {
    return s_->die(Result::illegal_address);
  }
  if (s_->backing) {
    for_pieces(to, 0, bytes,
               [&](const sim::Segment& seg, std::size_t at, std::size_t, std::size_t len) {
                 seg.storage->fill(at, value, len);
               });
  }
  s_->enqueue(*s, touches(to, AccessKind::write), "cuMemsetD8Async");
  return Result::success;
}

}  // namespace gvm::vmm
