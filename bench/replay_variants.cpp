// gvm-replay-variants: the table of docs/design-notes.md ("Chunks"), generated.
// Replays a trace (default: the shipped GPT-2 trace) on a simulated H200, once
// per configuration below, and prints one Markdown table row per variant:
// reserved / live at the peaks, chunks mapped and unmapped, driver calls.
//
// These figures are the allocator's decisions, the same on the real driver
// with the same granularity (docs/replay.md), so the CPU run is the one the
// documentation carries; tools/doc_block.cmake checks that the page holds
// exactly what this prints (CTest docs_design_notes_variants_current).
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "gvm/allocator.hpp"
#include "gvm/config.hpp"
#include "gvm/vmm/sim_driver.hpp"
#include "replay.hpp"
#include "replay_cli.hpp"
#include "trace.hpp"

namespace {

struct Variant {
  const char* what;
  const char* conf;  // over the defaults, not over GVM_CONF: the table is of the defaults
};

constexpr Variant kVariants[] = {
    {"default (128 MiB chunks, slack 0.02)", ""},
    {"32 MiB chunks", "max_chunk_size:32MiB"},
    {"64 MiB chunks", "max_chunk_size:64MiB"},
    {"256 MiB chunks", "max_chunk_size:256MiB"},
    {"never release before growth", "reserve_slack:-1"},
    {"no VMM (`cuMemAlloc` segments)", "no_vmm:true"},
    {"no VMM, never release", "no_vmm:true,reserve_slack:-1"},
};

std::string with_commas(std::uint64_t n) {
  std::string digits = std::to_string(n);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

int run(const std::string& trace_path) {
  const gvm::bench::Trace trace = gvm::bench::read_trace(trace_path);
  std::cout
      << "| variant | `GVM_CONF` | reserved ÷ live | chunks mapped | chunks unmapped | driver "
         "calls |\n|---|---|---|---|---|---|\n";
  for (const Variant& v : kVariants) {
    auto driver = gvm::vmm::SimDriver::uniform(gvm::vmm::Profile::h200, 1);
    gvm::bench::TraceStreams streams(*driver, 0, trace);
    gvm::Allocator allocator(*driver, gvm::parse_config(v.conf));
    gvm::bench::ReplayOptions options;
    options.streams = &streams;
    options.sample_memory = true;
    options.free_leftovers = false;  // the counts are of the replay, not of a cleanup
    const gvm::bench::ReplayResult r = gvm::bench::replay(trace, allocator, *driver, 0, options);
    const gvm::DeviceStats s = allocator.device_stats(0);
    const double ratio =
        static_cast<double>(r.peak_reserved_bytes) / static_cast<double>(r.peak_live_bytes);
    char ratio_text[32];
    std::snprintf(ratio_text, sizeof ratio_text, "%.4f", ratio);
    std::cout << "| " << v.what << " | `" << (*v.conf ? v.conf : "(none)") << "` | " << ratio_text
              << " | " << with_commas(s.chunks_mapped) << " | " << with_commas(s.chunks_unmapped)
              << " | " << with_commas(r.driver_calls) << " |\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc > 2 || (argc == 2 && std::string(argv[1]).rfind('-', 0) == 0)) {
      std::cerr << "usage: gvm-replay-variants [TRACE]   (default: the shipped GPT-2 trace)\n";
      return argc == 2 && (std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help") ? 0
                                                                                             : 1;
    }
    return run(argc == 2 ? argv[1] : gvm::bench::default_trace());
  } catch (const gvm::bench::TraceError& e) {
    std::cerr << "gvm-replay-variants: bad trace: " << e.what() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "gvm-replay-variants: " << e.what() << "\n";
  }
  return 1;
}
