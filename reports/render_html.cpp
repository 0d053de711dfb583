// The document (document.h) as one self-contained HTML page: report.html, every plot embedded
// as a data: URI.

#include <fstream>
#include <sstream>

#include "reports/document.h"
#include "reports/escape_text.h"

namespace sb::reports {
namespace {

std::string htmlEscape(const std::string& s) {
  return escapedText(s, {{'&', "&amp;"}, {'<', "&lt;"}, {'>', "&gt;"}, {'"', "&quot;"}});
}

std::string base64(const std::string& in) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const unsigned v = (static_cast<unsigned char>(in[i]) << 16) |
                       (static_cast<unsigned char>(in[i + 1]) << 8) |
                       static_cast<unsigned char>(in[i + 2]);
    out += k[(v >> 18) & 63];
    out += k[(v >> 12) & 63];
    out += k[(v >> 6) & 63];
    out += k[v & 63];
  }
  if (i < in.size()) {
    unsigned v = static_cast<unsigned char>(in[i]) << 16;
    if (i + 1 < in.size()) v |= static_cast<unsigned char>(in[i + 1]) << 8;
    out += k[(v >> 18) & 63];
    out += k[(v >> 12) & 63];
    out += i + 1 < in.size() ? k[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void htmlTable(std::ostringstream& o, const Table& t) {
  o << "<table" << (t.id.empty() ? "" : " id=\"" + htmlEscape(t.id) + "\"") << "><thead><tr>";
  for (const auto& h : t.head) o << "<th>" << htmlEscape(h) << "</th>";
  o << "</tr></thead><tbody>\n";
  for (const auto& r : t.rows) {
    o << "<tr>";
    for (const auto& c : r) {
      o << "<td" << (c.cls.empty() ? "" : " class=\"" + htmlEscape(c.cls) + "\"") << ">"
        << htmlEscape(c.text) << "</td>";
    }
    o << "</tr>\n";
  }
  o << "</tbody></table>\n";
}

}  // namespace

std::string Document::html(const std::string& title, const std::string& baseDir) const {
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>"
    << htmlEscape(title) << "</title>\n<style>\n"
    << "body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1400px;"
       "padding:0 1em;color:#222}\n"
       "table{border-collapse:collapse;margin:.5em 0 1em;font-size:13px}\n"
       "th,td{border:1px solid #ccc;padding:3px 7px;text-align:left;vertical-align:top}\n"
       "th{background:#f3f3f3}\n"
       "td.pass,td.ok,td.unchanged{background:#e9f7ec}\n"
       "td.fail,td.error,td.regressed{background:#fde2e1;font-weight:bold}\n"
       "td.unsupported,td.skipped,td.gone,td.new,td.warn{background:#fff5d6}\n"
       "td.improved,td.fixed{background:#dff0ff}\n"
       "p.gate-fail{color:#a40000;font-weight:bold;font-size:1.2em}\n"
       "p.gate-pass{color:#176b2c;font-weight:bold;font-size:1.2em}\n"
       "img.plot{max-width:100%;border:1px solid #ddd;margin:.3em 0}\n"
       "h2{border-bottom:1px solid #ccc;margin-top:1.6em}\n"
       "details{margin:.2em 0}summary{cursor:pointer;font-size:13px}\n"
       "summary.fail{color:#a40000;font-weight:bold}\n"
       "p.verdict-fail{background:#a40000;color:#fff;font-weight:bold;font-size:1.4em;"
       "padding:.5em .8em;margin:.4em 0}\n"
       "p.verdict-pass{background:#176b2c;color:#fff;font-weight:bold;font-size:1.4em;"
       "padding:.5em .8em;margin:.4em 0}\n"
       "p.verdict-warn{background:#b36b00;color:#fff;font-weight:bold;font-size:1.4em;"
       "padding:.5em .8em;margin:.4em 0}\n"
       "nav#toc{font-size:13px;margin:.4em 0 .8em}\n"
    << "</style></head>\n<body>\n";
  // Headings' ids never repeat a table's (or a <details>'s) id, nor each other.
  std::vector<std::string> reserved;
  for (const auto& b : blocks_) {
    if (!b.table.id.empty()) {
      reserved.push_back(b.table.id);
      reserved.push_back(b.table.id + "-d");
    }
  }
  const auto ids = anchors(reserved);
  for (size_t bi = 0; bi < blocks_.size(); ++bi) {
    const Block& b = blocks_[bi];
    switch (b.kind) {
      case Block::Kind::kHeading:
        o << "<h" << b.level << " id=\"" << htmlEscape(ids[bi]) << "\">" << htmlEscape(b.text)
          << "</h" << b.level << ">\n";
        break;
      case Block::Kind::kParagraph:
        o << "<p" << (b.cls.empty() ? "" : " class=\"" + b.cls + "\"") << ">" << htmlEscape(b.text)
          << "</p>\n";
        break;
      case Block::Kind::kList:
        o << "<ul>\n";
        for (const auto& i : b.items) o << "<li>" << htmlEscape(i) << "</li>\n";
        o << "</ul>\n";
        break;
      case Block::Kind::kImage:
        o << "<div><img class=\"plot\" alt=\"" << htmlEscape(b.text)
          << "\" src=\"data:image/png;base64," << base64(slurp(baseDir + "/" + b.path))
          << "\"></div>\n";
        break;
      case Block::Kind::kTable:
        htmlTable(o, b.table);
        break;
      case Block::Kind::kToc: {
        o << "<nav id=\"toc\">Contents:";
        const auto hs = sections(ids);
        for (size_t i = 0; i < hs.size(); ++i) {
          o << (i ? " · " : " ") << "<a href=\"#" << htmlEscape(hs[i].second) << "\">"
            << htmlEscape(hs[i].first) << "</a>";
        }
        o << "</nav>\n";
        break;
      }
      case Block::Kind::kDetails:
        o << "<details" << (b.table.id.empty() ? "" : " id=\"" + htmlEscape(b.table.id) + "-d\"")
          << "><summary" << (b.cls.empty() ? "" : " class=\"" + htmlEscape(b.cls) + "\"") << ">"
          << htmlEscape(b.text) << "</summary>\n";
        htmlTable(o, b.table);
        o << "</details>\n";
        break;
    }
  }
  o << "<script>\nwindow.addEventListener('load', function () {\n"
       "  var imgs = document.images, ok = 0, broken = [];\n"
       "  for (var i = 0; i < imgs.length; i++) {\n"
       "    if (imgs[i].complete && imgs[i].naturalWidth > 0) ok++; else "
       "broken.push(imgs[i].alt);\n"
       "  }\n"
       "  document.body.setAttribute('data-images-total', imgs.length);\n"
       "  document.body.setAttribute('data-images-loaded', ok);\n"
       "  document.body.setAttribute('data-images-broken', broken.join('|'));\n"
       // What a reader sees without scrolling: the ids of the lead blocks whose top is inside
       // the window (the screenshot test checks that the verdict and what changed are).
       "  var seen = [], lead = document.querySelectorAll('p[class^=verdict], #what-changed, "
       "table#changes, nav#toc');\n"
       "  for (var j = 0; j < lead.length; j++) {\n"
       "    var top = lead[j].getBoundingClientRect().top + window.scrollY;\n"
       "    if (top < window.innerHeight) seen.push(lead[j].id || lead[j].className);\n"
       "  }\n"
       "  document.body.setAttribute('data-first-screen', seen.join(' '));\n"
       "});\n</script>\n</body></html>\n";
  return o.str();
}

}  // namespace sb::reports
