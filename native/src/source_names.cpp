// What a source is called in alerts and messages: twins of runtime/live_source.py's live_source_name and
// without_password and runtime/sources.py's video_file_name (tests/vectors/source_names.json holds them together).
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "sdqes/runtime.hpp"

namespace sdqes {

namespace fs = std::filesystem;

namespace {

constexpr size_t kNameLimit = 64;  // live_source.NAME_LIMIT
constexpr const char* kHiddenPassword = "***";
const std::vector<std::string> kUrlPrefixes{"rtsp://", "rtsps://", "http://", "https://", "udp://", "tcp://"};
const std::vector<std::string> kWebPrefixes{"http://", "https://"};

bool starts_with(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }

bool starts_with_any(const std::string& text, const std::vector<std::string>& prefixes) {
  return std::any_of(prefixes.begin(), prefixes.end(), [&](const std::string& p) { return starts_with(text, p); });
}

// urllib.parse.urlsplit's parts of "scheme://netloc/path?query#fragment" (fragment dropped).
struct UrlParts {
  std::string netloc, path, query;
  size_t netloc_at = std::string::npos;  // where netloc begins in the URL
};

UrlParts split_url(const std::string& url) {
  UrlParts parts;
  const size_t scheme_end = url.find("://");
  const size_t start = scheme_end == std::string::npos ? 0 : scheme_end + 3;
  const std::string rest = url.substr(0, url.find('#')).substr(start);
  const size_t netloc_end = rest.find_first_of("/?");
  parts.netloc = rest.substr(0, netloc_end);
  parts.netloc_at = start;
  const std::string tail = netloc_end == std::string::npos ? "" : rest.substr(netloc_end);
  const size_t query_at = tail.find('?');
  parts.path = tail.substr(0, query_at);
  if (query_at != std::string::npos) parts.query = tail.substr(query_at + 1);
  return parts;
}

std::string after_last_at(const std::string& netloc) {
  const size_t at = netloc.rfind('@');
  return at == std::string::npos ? netloc : netloc.substr(at + 1);
}

// PurePosixPath(path).name: the last part, "." parts and empty ones left out.
std::string path_name(const std::string& path) {
  std::string name, part;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      if (!part.empty() && part != ".") name = part;
      part.clear();
    } else {
      part += path[i];
    }
  }
  return name;
}

// PurePosixPath(...).stem: the name without its last suffix (".hidden" and "clip." keep theirs).
std::string stem_of(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot != std::string::npos && dot > 0 && dot < name.size() - 1 ? name.substr(0, dot) : name;
}

// urlsplit(...).hostname: the host without user, port or IPv6 brackets, in lower case.
std::string hostname_of(const std::string& netloc) {
  std::string host = after_last_at(netloc);
  if (starts_with(host, "[")) {
    host = host.substr(1, host.find(']') - 1);  // npos - 1: to the end where "]" is missing
  } else {
    host = host.substr(0, host.find(':'));
  }
  std::transform(host.begin(), host.end(), host.begin(), [](unsigned char c) { return std::tolower(c); });
  return host;
}

bool name_character(unsigned char c) { return (c < 128 && std::isalnum(c)) || c == '.' || c == '_'; }

// str.rstrip(chars) and str.lstrip(chars).
std::string rstrip(const std::string& text, const char* chars) {
  const size_t end = text.find_last_not_of(chars);
  return end == std::string::npos ? "" : text.substr(0, end + 1);
}

std::string lstrip(const std::string& text, const char* chars) {
  const size_t start = text.find_first_not_of(chars);
  return start == std::string::npos ? "" : text.substr(start);
}

}  // namespace

bool is_gstreamer_pipeline(const std::string& target) {
  return target.find('!') != std::string::npos && !starts_with_any(target, kUrlPrefixes);
}

bool is_stream_url(const std::string& target) { return starts_with_any(target, kUrlPrefixes); }

std::string without_password(const std::string& url) {
  const UrlParts parts = split_url(url);
  const size_t at = parts.netloc.rfind('@');
  if (at == std::string::npos) return url;
  const std::string user = parts.netloc.substr(0, at);
  const size_t colon = user.find(':');
  if (colon == std::string::npos) return url;
  std::string shown = url;
  shown.replace(parts.netloc_at, parts.netloc.size(),
                user.substr(0, colon) + ":" + kHiddenPassword + "@" + parts.netloc.substr(at + 1));
  return shown;
}

std::string live_source_name(const std::string& target) {
  std::string words;
  if (starts_with(target, "/")) {
    words = path_name(target);
  } else if (is_gstreamer_pipeline(target)) {
    words = target.substr(0, target.find('!'));
  } else {
    const UrlParts parts = split_url(target);
    words = after_last_at(parts.netloc) + " " + parts.path + " " + parts.query;
  }
  std::string name;
  for (const unsigned char c : words) {  // runs of other characters become one "-"
    if (name_character(c)) {
      name += static_cast<char>(c);
    } else if (name.empty() || name.back() != '-') {  // "-" itself is one of the others: never kept as it is
      name += '-';
    }
  }
  name = rstrip(lstrip(rstrip(name, "-."), "-.").substr(0, kNameLimit), "-.");  // .strip("-.")[:64].rstrip("-.")
  return name.empty() ? "stream" : name;
}

std::string terminal_safe(const std::string& line) {
  static const char* const kHex = "0123456789abcdef";
  std::string safe;
  safe.reserve(line.size());
  for (size_t i = 0; i < line.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(line[i]);
    const bool c1 = c == 0xC2 && i + 1 < line.size() && static_cast<unsigned char>(line[i + 1]) >= 0x80 &&
                    static_cast<unsigned char>(line[i + 1]) <= 0x9F;  // U+0080..U+009F in UTF-8
    if (c1) c = static_cast<unsigned char>(line[++i]);
    if (!c1 && (c == '\t' || (c >= 0x20 && c != 0x7F))) {
      safe += static_cast<char>(c);
    } else if (c == '\n') {
      safe += "\\n";
    } else if (c == '\r') {
      safe += "\\r";
    } else {
      safe += {'\\', 'x', kHex[c >> 4], kHex[c & 0xF]};
    }
  }
  return safe;
}

std::string camera_name(int index) { return "camera" + std::to_string(index); }

std::string source_name(const std::string& source) {
  return is_live_kind(source_kind(source)) ? live_source_name(source) : video_file_name(source);
}

bool is_live_kind(const std::string& kind) { return kind == "camera" || kind == "stream" || kind == "device"; }

std::string source_kind(const std::string& source) {
  if (!source.empty() && source.find_first_not_of("0123456789") == std::string::npos) return "camera";
  if (starts_with_any(source, kWebPrefixes)) return "web";
  std::error_code error;  // a name longer than a file's may be (a long GStreamer pipeline) names no file
  const auto status = fs::status(source, error);
  const bool exists = !error && fs::exists(status);
  if (starts_with_any(source, kUrlPrefixes) || (is_gstreamer_pipeline(source) && !exists)) return "stream";
  if (!exists) return source == "/dev" || starts_with(source, "/dev/") ? "missing camera" : "missing";
  if (fs::is_directory(status)) return "folder";
  return fs::is_character_file(status) ? "device" : "file";
}

std::vector<std::string> give_distinct_names(std::vector<std::string>& names) {
  std::set<std::string> taken(names.begin(), names.end()), seen;
  std::vector<std::string> renamed;
  for (auto& name : names) {
    if (seen.count(name)) {
      int n = 2;
      while (taken.count(name + "-" + std::to_string(n))) ++n;
      name += "-" + std::to_string(n);
      taken.insert(name);
      renamed.push_back(name);
    }
    seen.insert(name);
  }
  return renamed;
}

std::string video_file_name(const std::string& location) {
  const bool served = starts_with_any(location, kWebPrefixes);
  const UrlParts parts = served ? split_url(location) : UrlParts{};
  const std::string stem = stem_of(path_name(served ? parts.path : location));
  if (!stem.empty()) return stem;
  const std::string host = served ? hostname_of(parts.netloc) : "";
  return host.empty() ? "video" : host;
}

}  // namespace sdqes
