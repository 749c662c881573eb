// Rows to text: the aligned table, the JSON document, the wire form for gathering.
#include <algorithm>
#include <cstdio>
#include <map>
#include <tuple>

#include "tessera/doctor/doctor.h"

namespace tessera::doctor {

const char* status_name(Status s) {
  switch (s) {
    case Status::Pass:
      return "PASS";
    case Status::Info:
      return "INFO";
    case Status::Warn:
      return "WARN";
    case Status::Fail:
      return "FAIL";
  }
  return "?";
}

bool any_failed(const std::vector<Row>& rows) {
  return std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.status == Status::Fail; });
}

std::string format_table(const std::vector<Row>& rows) {
  size_t wc = 5, ws = 5;
  for (const Row& r : rows) {
    wc = std::max(wc, r.check.size());
    ws = std::max(ws, r.scope.size());
  }
  auto line = [&](const std::string& c, const std::string& st, const std::string& sc, const std::string& d) {
    std::string s = c + std::string(wc - c.size() + 2, ' ') + st + std::string(8 - st.size(), ' ') + sc +
                    std::string(ws - sc.size() + 2, ' ') + d + "\n";
    return s;
  };
  std::string out = line("check", "status", "scope", "detail");
  int counts[4] = {0, 0, 0, 0};
  for (const Row& r : rows) {
    out += line(r.check, status_name(r.status), r.scope, r.detail);
    if (!r.fix.empty()) out += std::string(wc + 2 + 8 + ws + 2, ' ') + "fix: " + r.fix + "\n";
    counts[static_cast<int>(r.status)]++;
  }
  char summary[160];
  std::snprintf(summary, sizeof summary, "doctor: %d PASS, %d INFO, %d WARN, %d FAIL\n", counts[0], counts[1],
                counts[2], counts[3]);
  return out + summary;
}

namespace {
std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += static_cast<char>(c);
    } else if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else {
      o += static_cast<char>(c);
    }
  }
  return o + "\"";
}
}  // namespace

std::string format_json(const std::vector<Row>& rows, int world_size) {
  std::string o = "{\"world_size\": " + std::to_string(world_size) +
                  ", \"ok\": " + (any_failed(rows) ? "false" : "true") + ", \"checks\": [";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    o += std::string(i ? ",\n  " : "\n  ") + "{\"check\": " + json_string(r.check) + ", \"status\": \"" +
         status_name(r.status) + "\", \"scope\": " + json_string(r.scope) + ", \"detail\": " + json_string(r.detail) +
         ", \"fix\": " + json_string(r.fix) + "}";
  }
  return o + "\n]}\n";
}

// Fields separated by \x1f, rows by \x1e (neither appears in file names or messages we make).
std::string serialize_rows(const std::vector<Row>& rows) {
  std::string o;
  for (const Row& r : rows) {
    o += r.check + '\x1f' + std::to_string(static_cast<int>(r.status)) + '\x1f' + r.detail + '\x1f' + r.fix + '\x1f' +
         r.scope + '\x1e';
  }
  return o;
}

std::vector<Row> deserialize_rows(const std::string& text) {
  std::vector<Row> rows;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\x1e', pos);
    if (end == std::string::npos) break;
    std::vector<std::string> f;
    size_t a = pos;
    for (;;) {
      size_t b = text.find('\x1f', a);
      if (b == std::string::npos || b > end) {
        f.push_back(text.substr(a, end - a));
        break;
      }
      f.push_back(text.substr(a, b - a));
      a = b + 1;
    }
    if (f.size() == 5) {
      Row r{f[0], static_cast<Status>(std::clamp(std::atoi(f[1].c_str()), 0, 3)), f[2], f[3], f[4]};
      rows.push_back(std::move(r));
    }
    pos = end + 1;
  }
  return rows;
}

std::vector<Row> merge_rows(const std::vector<std::vector<Row>>& per_rank, const std::vector<std::string>& hosts) {
  const int n = static_cast<int>(per_rank.size());
  std::vector<std::string> order;  // checks by first appearance
  struct Group {
    Row row;
    std::vector<int> ranks;
  };
  std::map<std::string, std::vector<Group>> groups;
  for (int r = 0; r < n; ++r) {
    for (const Row& row : per_rank[r]) {
      auto& gs = groups[row.check];
      if (gs.empty()) order.push_back(row.check);
      auto it = std::find_if(gs.begin(), gs.end(), [&](const Group& g) {
        return g.row.status == row.status && g.row.detail == row.detail && g.row.fix == row.fix &&
               g.row.scope == row.scope;
      });
      if (it == gs.end()) {
        gs.push_back({row, {r}});
      } else {
        it->ranks.push_back(r);
      }
    }
  }
  std::vector<Row> out;
  for (const std::string& check : order) {
    for (Group& g : groups[check]) {
      Row row = g.row;
      if (row.scope.empty()) {
        if (n > 1 && static_cast<int>(g.ranks.size()) == n) {
          row.scope = "all ranks";
        } else if (n == 1) {
          row.scope = "rank 0";
        } else {
          std::string s = g.ranks.size() == 1 ? "rank " : "ranks ";
          for (size_t i = 0; i < g.ranks.size(); ++i) {
            if (i) s += ",";
            s += std::to_string(g.ranks[i]);
            if (g.ranks.size() == 1 && g.ranks[i] < static_cast<int>(hosts.size()) && !hosts[g.ranks[i]].empty())
              s += " (" + hosts[g.ranks[i]] + ")";
          }
          row.scope = s;
        }
      }
      out.push_back(std::move(row));
    }
  }
  return out;
}

}  // namespace tessera::doctor
