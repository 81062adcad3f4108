// Config: every knob of gvmalloc, in one place.
//
// Also read from the environment variable GVM_CONF, written like
// PYTORCH_CUDA_ALLOC_CONF: "key:value,key:value". Sizes take a unit suffix
// (B, KiB, MiB, GiB, TiB, or K/M/G/T meaning the same powers of two); booleans
// are true/false/1/0. An unknown key or a bad value is a config_error that
// names it. docs/config.md lists every key.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace gvm {

enum class PeerPolicy : int {
  automatic,       // chosen per device pair from DeviceCaps
  per_allocation,  // only the scratch buffer is granted to peers (cuMemSetAccess)
  global,          // context peer access, enabled once, fenced (pre-Ampere)
  none,            // no P2P path: copies are staged by the driver
};

struct Config {
  // Virtual address space reserved per device for the arena. 0 = four times
  // the device's memory (address space is cheap: 1 TiB reserves in ~3 µs).
  std::size_t arena_bytes = 0;  // key: arena_size
  // Largest physical chunk (one cuMemCreate handle) made in one growth step.
  // Growth maps exactly the granules a request needs, as handles of up to this
  // size. Driver cost follows the number of handles (docs/measurements.md: 512
  // handles of 2 MiB cost ~20x one 1 GiB handle), but a handle can be
  // unmapped only when wholly free. Replaying the GPT-2 trace with
  // reserve_slack 0.02: 32 MiB -> 1.018 reserved/live and 2,912 handles made,
  // 64 MiB -> 1.017 / 1,628, 128 MiB -> 1.017 / 927, 256 MiB -> 1.028 / 877
  // (docs/design-notes.md). 128 MiB is the knee.
  std::size_t max_chunk_bytes = std::size_t{128} << 20;  // key: max_chunk_size
  // Before the arena grows, whole cached chunks are returned to the driver
  // (behind the fence) while reserved bytes would exceed live bytes x
  // (1 + reserve_slack). This is what keeps peak reserved near peak live when
  // request sizes vary from step to step (without it the GPT-2 trace reserves
  // 1.073x its live bytes, with 0.02 about 1.017x). Negative = never.
  double reserve_slack = 0.02;  // key: reserve_slack
  // Cap on reserved (mapped) bytes per device; 0 = no cap. Like PyTorch's
  // per-process memory fraction, but in bytes.
  std::size_t max_reserved_bytes = 0;  // key: max_reserved
  // Fraction of device memory that may be reserved (0 < f <= 1); 0 = no cap.
  // With max_reserved_bytes too, the smaller cap wins.
  double memory_fraction = 0.0;  // key: memory_fraction
  // When cached (mapped but free) bytes exceed this, whole free chunks are
  // returned to the driver (behind the fence). SIZE_MAX = never.
  std::size_t release_threshold_bytes = SIZE_MAX;  // key: release_threshold
  // Requests up to this size are served from O(1) size classes.
  std::size_t small_block_max_bytes = std::size_t{1} << 20;  // key: small_max
  // A small-block size class gets spans (its O(1) cache) on a stream only
  // after this many allocations of it on that stream; until then the
  // best-fit arena serves it. A span commits a whole granule to one class
  // of one stream, which a class of a few blocks mostly wastes
  // (docs/design-notes.md, "Fragmentation"). 0 = spans from the first one.
  std::uint32_t span_warmup_allocations = 256;  // key: span_warmup
  // Size classes whose slots are larger than this get no spans of their own:
  // the best-fit arena serves them at 512 B rounding, as it serves cold
  // classes (a 256 KiB request may still take a free slot of a span that
  // hosts shared spans).
  // A span of such a class holds few slots (32 of 64 KiB), and its blocks
  // living in spans once it warms moves the large blocks around them: the
  // ResNet-50 program crept 40 MiB past its first step's peak that way
  // (docs/design-notes.md, "Rule 8"). 32 KiB is the largest slot that
  // shares spans (shared_spans); small_max (1 MiB) gives every class spans.
  std::size_t span_max_bytes = std::size_t{32} << 10;  // key: span_max
  // Classes of up to 32 KiB start in shared spans: 256 KiB each, eight to a
  // granule, until the class holds a granule's worth; then whole granules.
  // A class of a few dozen live blocks then holds 256 KiB, not 2 MiB
  // (docs/design-notes.md, "Shared spans"). false = every span a granule.
  bool shared_spans = true;  // key: shared_spans
  // Force the no-VMM path (chunks from cuMemAlloc) even where VMM works.
  bool force_no_vmm = false;  // key: no_vmm
  // Peer access policy for every device pair (automatic = from DeviceCaps).
  PeerPolicy peer_policy = PeerPolicy::automatic;  // key: peer_policy
  // Physical chunk size of the peer scratch buffer. A peer grant costs ~1 ms
  // per 64 MiB and ~9.4 ms per GiB on H200 (docs/measurements.md).
  std::size_t scratch_chunk_bytes = std::size_t{64} << 20;  // key: scratch_chunk_size
  // Reserve for the scratch buffer per device; 0 = the device's memory size.
  std::size_t scratch_arena_bytes = 0;  // key: scratch_arena_size
  // How the fence before a scratch chunk's access change or unmap finds the
  // work that may touch it. false ("devices"): synchronise every device that
  // has access - always safe. true ("tracked"): wait only for the streams
  // that allocated the blocks and those named with record_stream(ptr, stream,
  // device) - cheaper, but the caller promises to name every peer stream that
  // uses the scratch (docs/peer-access.md measures both).
  bool scratch_fence_tracked = false;  // key: scratch_fence (devices|tracked)
  // Test hook: with false the fence does nothing. Never set in production;
  // it exists so tests can prove the fence is what prevents the hazards.
  bool fence_enabled = true;  // key: fence (documented as a test hook)
};

// Parses "key:value,..." over `base`. Empty text returns `base`.
// Throws config_error naming the key (and the value) that is wrong; the
// message does not say where the text came from (the caller knows).
Config parse_config(std::string_view text, Config base = {});

// parse_config(getenv("GVM_CONF")) or defaults when unset. Its errors start
// with "GVM_CONF: ".
Config config_from_env();

// "per_allocation" etc.
const char* to_string(PeerPolicy p) noexcept;

// The config as "key:value,..." (round-trips through parse_config).
std::string to_string(const Config& c);

}  // namespace gvm
