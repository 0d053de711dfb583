// The document (document.h) as Markdown: report.md.

#include <sstream>

#include "reports/document.h"

namespace sb::reports {
namespace {

std::string mdEscape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '|')
      o += "\\|";
    else if (c == '\n')
      o += ' ';
    else
      o += c;
  }
  return o;
}

std::string htmlText(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<')
      o += "&lt;";
    else if (c == '>')
      o += "&gt;";
    else if (c == '&')
      o += "&amp;";
    else
      o += c;
  }
  return o;
}

// `inHtml`: the table sits in an HTML block (<details>), where a cell's '<' would be markup.
void pipeTable(std::ostringstream& o, const Table& t, bool inHtml = false) {
  const auto cell = [&](const std::string& s) { return mdEscape(inHtml ? htmlText(s) : s); };
  o << "|";
  for (const auto& h : t.head) o << " " << cell(h) << " |";
  o << "\n|";
  for (size_t i = 0; i < t.head.size(); ++i) o << "---|";
  o << "\n";
  for (const auto& r : t.rows) {
    o << "|";
    for (const auto& c : r) o << " " << cell(c.text) << " |";
    o << "\n";
  }
  o << "\n";
}

}  // namespace

std::string Document::markdown() const {
  std::ostringstream o;
  for (const auto& b : blocks_) {
    switch (b.kind) {
      case Block::Kind::kHeading:
        o << std::string(b.level, '#') << " " << b.text << "\n\n";
        break;
      case Block::Kind::kParagraph:
        o << b.text << "\n\n";
        break;
      case Block::Kind::kList:
        for (const auto& i : b.items) o << "- " << mdEscape(i) << "\n";
        o << "\n";
        break;
      case Block::Kind::kImage:
        o << "![" << b.text << "](" << b.path << ")\n\n";
        break;
      case Block::Kind::kTable:
        pipeTable(o, b.table);
        break;
      case Block::Kind::kToc: {
        o << "Contents:";
        const auto hs = sections();
        for (size_t i = 0; i < hs.size(); ++i) {
          o << (i ? " · " : " ") << "[" << hs[i] << "](#" << anchor(hs[i]) << ")";
        }
        o << "\n\n";
        break;
      }
      case Block::Kind::kDetails:
        o << "<details><summary>" << htmlText(b.text) << "</summary>\n\n";
        pipeTable(o, b.table, true);
        o << "</details>\n\n";
        break;
    }
  }
  return o.str();
}

}  // namespace sb::reports
