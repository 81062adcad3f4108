// The shipped traces and what the peers reserve on them: traces/peers.csv
// (traces/README.md says how those figures were measured).
//
//   trace,allocator,ratio,ns_per_op,measured
//   gpt2_train,torch_expandable,1.079,857,2026-12-01 ...
//
// Lines starting with '#' are comments; the first other line is the header.
// ns_per_op may be empty (not measured).
#pragma once

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace gvm::bench {

struct PeerFigure {
  double ratio = 0;                  // peak reserved / peak live
  std::optional<double> ns_per_op;   // wall time per allocate or free, on a GPU
  std::string measured;              // when and where
};

struct ShippedTrace {
  std::string name;  // "gpt2_train"
  std::string path;  // traces/gpt2_train.trace.gz
  std::map<std::string, PeerFigure> peers;  // by allocator: torch, torch_expandable, cudaMallocAsync
};

// The peers' names in the order the table shows them, with their labels.
struct PeerColumn {
  const char* key;
  const char* label;
};
inline constexpr PeerColumn kPeerColumns[] = {
    {"torch", "PyTorch"}, {"torch_expandable", "expandable"}, {"cudaMallocAsync", "cudaMallocAsync"}};

// Parses peers.csv text; `dir` is the traces folder the paths are made in.
// Throws std::runtime_error naming the line for a malformed one.
std::vector<ShippedTrace> parse_peers_csv(const std::string& text, const std::string& source,
                                          const std::string& dir);

// traces/peers.csv of the source tree (GVM_SOURCE_DIR), else of the current
// directory. Throws std::runtime_error when neither exists or it is malformed.
std::vector<ShippedTrace> shipped_traces(const std::string& source_dir);

}  // namespace gvm::bench
