// A strict little JSON reader for tests: proves that what gvmalloc writes is
// valid JSON (RFC 8259) and lets a test look at the values.
#pragma once

#include <cctype>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace gvm::test {

struct Json {
  enum class Kind { null, boolean, number, string, array, object } kind = Kind::null;
  bool boolean = false;
  std::string text;  // number (as written) or string (unescaped)
  std::vector<Json> items;
  std::map<std::string, Json> members;
  std::vector<std::string> keys_in_order;

  const Json* find(const std::string& key) const {
    auto it = members.find(key);
    return it == members.end() ? nullptr : &it->second;
  }
  std::uint64_t as_u64() const { return std::stoull(text); }
};

class JsonReader {
 public:
  // Parses all of `text`; on failure returns false and says where.
  static bool parse(std::string_view text, Json* out, std::string* why) {
    JsonReader r(text);
    Json v;
    if (!r.value(v, 0) || (r.skip_ws(), r.pos_ != text.size())) {
      if (why) *why = "invalid JSON at offset " + std::to_string(r.pos_) + ": " + r.error_;
      return false;
    }
    if (out) *out = std::move(v);
    return true;
  }

 private:
  explicit JsonReader(std::string_view t) : t_(t) {}

  bool fail(const char* what) {
    if (error_.empty()) error_ = what;
    return false;
  }
  void skip_ws() {
    while (pos_ < t_.size() &&
           (t_[pos_] == ' ' || t_[pos_] == '\n' || t_[pos_] == '\r' || t_[pos_] == '\t'))
      ++pos_;
  }
  bool literal(std::string_view word) {
    if (t_.substr(pos_, word.size()) != word) return fail("bad literal");
    pos_ += word.size();
    return true;
  }
  bool value(Json& v, int depth) {
    if (depth > 64) return fail("too deep");
    skip_ws();
    if (pos_ >= t_.size()) return fail("unexpected end");
    const char c = t_[pos_];
    if (c == '{') return object(v, depth);
    if (c == '[') return array(v, depth);
    if (c == '"') {
      v.kind = Json::Kind::string;
      return string(v.text);
    }
    if (c == 't') {
      v.kind = Json::Kind::boolean;
      v.boolean = true;
      return literal("true");
    }
    if (c == 'f') {
      v.kind = Json::Kind::boolean;
      return literal("false");
    }
    if (c == 'n') return literal("null");
    return number(v);
  }
  bool number(Json& v) {
    const std::size_t start = pos_;
    auto digits = [&] {
      const std::size_t s = pos_;
      while (pos_ < t_.size() && std::isdigit(static_cast<unsigned char>(t_[pos_]))) ++pos_;
      return pos_ - s;
    };
    if (pos_ < t_.size() && t_[pos_] == '-') ++pos_;
    if (pos_ < t_.size() && t_[pos_] == '0') {
      ++pos_;
    } else if (digits() == 0) {
      return fail("bad number");
    }
    if (pos_ < t_.size() && t_[pos_] == '.') {
      ++pos_;
      if (digits() == 0) return fail("bad fraction");
    }
    if (pos_ < t_.size() && (t_[pos_] == 'e' || t_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < t_.size() && (t_[pos_] == '+' || t_[pos_] == '-')) ++pos_;
      if (digits() == 0) return fail("bad exponent");
    }
    v.kind = Json::Kind::number;
    v.text = std::string(t_.substr(start, pos_ - start));
    return true;
  }
  bool string(std::string& out) {
    ++pos_;  // opening quote
    while (pos_ < t_.size()) {
      const auto c = static_cast<unsigned char>(t_[pos_++]);
      if (c == '"') return true;
      if (c < 0x20) return fail("raw control character in string");
      if (c != '\\') {
        out += static_cast<char>(c);
        continue;
      }
      if (pos_ >= t_.size()) return fail("unfinished escape");
      const char e = t_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          if (pos_ + 4 > t_.size()) return fail("short \\u escape");
          unsigned code = 0;
          for (int i = 0; i < 4; ++i) {
            const char h = t_[pos_++];
            code <<= 4;
            if (h >= '0' && h <= '9')
              code |= static_cast<unsigned>(h - '0');
            else if (h >= 'a' && h <= 'f')
              code |= static_cast<unsigned>(h - 'a' + 10);
            else if (h >= 'A' && h <= 'F')
              code |= static_cast<unsigned>(h - 'A' + 10);
            else
              return fail("bad hex digit");
          }
          if (code >= 0x80) return fail("test reader handles only ASCII \\u escapes");
          out += static_cast<char>(code);
          break;
        }
        default: return fail("bad escape");
      }
    }
    return fail("unterminated string");
  }
  bool array(Json& v, int depth) {
    v.kind = Json::Kind::array;
    ++pos_;
    skip_ws();
    if (pos_ < t_.size() && t_[pos_] == ']') {
      ++pos_;
      return true;
    }
    for (;;) {
      Json item;
      if (!value(item, depth + 1)) return false;
      v.items.push_back(std::move(item));
      skip_ws();
      if (pos_ >= t_.size()) return fail("unterminated array");
      if (t_[pos_] == ']') {
        ++pos_;
        return true;
      }
      if (t_[pos_++] != ',') return fail("expected , or ]");
    }
  }
  bool object(Json& v, int depth) {
    v.kind = Json::Kind::object;
    ++pos_;
    skip_ws();
    if (pos_ < t_.size() && t_[pos_] == '}') {
      ++pos_;
      return true;
    }
    for (;;) {
      skip_ws();
      if (pos_ >= t_.size() || t_[pos_] != '"') return fail("expected a key");
      std::string key;
      if (!string(key)) return false;
      if (v.members.count(key) != 0) return fail("duplicate key");
      skip_ws();
      if (pos_ >= t_.size() || t_[pos_++] != ':') return fail("expected :");
      Json item;
      if (!value(item, depth + 1)) return false;
      v.keys_in_order.push_back(key);
      v.members.emplace(std::move(key), std::move(item));
      skip_ws();
      if (pos_ >= t_.size()) return fail("unterminated object");
      if (t_[pos_] == '}') {
        ++pos_;
        return true;
      }
      if (t_[pos_++] != ',') return fail("expected , or }");
    }
  }

  std::string_view t_;
  std::size_t pos_ = 0;
  std::string error_;
};

}  // namespace gvm::test
