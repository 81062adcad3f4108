#include "shipped_traces.hpp"

#include <charconv>
#include <fstream>
#include <sstream>
#include <system_error>

namespace gvm::bench {
namespace {

std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> out;
  std::string field;
  std::istringstream in(line);
  while (std::getline(in, field, ',')) out.push_back(field);
  if (!line.empty() && line.back() == ',') out.emplace_back();
  return out;
}

double number(const std::string& text, const std::string& where) {
  double v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || !(v > 0))
    throw std::runtime_error(where + ": expected a positive number, got '" + text + "'");
  return v;
}

}  // namespace

std::vector<ShippedTrace> parse_peers_csv(const std::string& text, const std::string& source,
                                          const std::string& dir) {
  std::vector<ShippedTrace> traces;
  std::istringstream in(text);
  std::string line;
  bool header = true;
  for (std::size_t n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    const std::string where = source + ":" + std::to_string(n);
    const std::vector<std::string> f = split(line);
    if (header) {
      if (f.size() < 4 || f[0] != "trace" || f[1] != "allocator" || f[2] != "ratio" ||
          f[3] != "ns_per_op")
        throw std::runtime_error(where + ": expected the header trace,allocator,ratio,ns_per_op,measured");
      header = false;
      continue;
    }
    if (f.size() < 4 || f[0].empty() || f[1].empty())
      throw std::runtime_error(where + ": expected trace,allocator,ratio,ns_per_op,measured");
    PeerFigure p;
    p.ratio = number(f[2], where);
    if (!f[3].empty()) p.ns_per_op = number(f[3], where);
    if (f.size() > 4) p.measured = f[4];
    ShippedTrace* t = nullptr;
    for (auto& x : traces)
      if (x.name == f[0]) t = &x;
    if (t == nullptr) {
      traces.push_back(ShippedTrace{f[0], dir + "/" + f[0] + ".trace.gz", {}});
      t = &traces.back();
    }
    t->peers[f[1]] = p;
  }
  if (traces.empty()) throw std::runtime_error(source + ": no traces listed");
  return traces;
}

std::vector<ShippedTrace> shipped_traces(const std::string& source_dir) {
  for (const std::string& dir : {source_dir + "/traces", std::string("traces")}) {
    if (dir == "/traces") continue;
    std::ifstream in(dir + "/peers.csv");
    if (!in) continue;
    std::ostringstream text;
    text << in.rdbuf();
    return parse_peers_csv(text.str(), dir + "/peers.csv", dir);
  }
  throw std::runtime_error("traces/peers.csv is neither in the source tree (" + source_dir +
                           ") nor in the current directory");
}

}  // namespace gvm::bench
