// The document (document.h) as Markdown: report.md.

#include <sstream>

#include "reports/document.h"
#include "reports/escape_text.h"

namespace sb::reports {
namespace {

// Text as Markdown shows it, never as markup: every character CommonMark could read as
// markup (emphasis, links, code, raw HTML, entities, headings, table pipes) backslash-escaped,
// line breaks as spaces. Names come from users' suites and files: a case named
// `<script>` or `[x](javascript:...)` is shown, not run (report.html escapes the same). What a
// terminal acts on (ESC, BEL, a direction override: a results folder's name, a noise file's
// host) is written as an escape ("\u001b") first, here and in report.html.
std::string mdEscape(const std::string& s) {
  return escapedText(s, {{'\\', "\\\\"},
                         {'`', "\\`"},
                         {'*', "\\*"},
                         {'_', "\\_"},
                         {'[', "\\["},
                         {']', "\\]"},
                         {'<', "\\<"},
                         {'>', "\\>"},
                         {'(', "\\("},
                         {')', "\\)"},
                         {'#', "\\#"},
                         {'!', "\\!"},
                         {'|', "\\|"},
                         {'~', "\\~"},
                         {'&', "\\&"},
                         {'\n', " "},
                         {'\r', " "}});
}

// A <details> summary's text: HTML-escaped, and the characters of a Markdown link as character
// references too, so that no renderer that reads Markdown inside HTML makes a link of them.
std::string htmlText(const std::string& s) {
  return escapedText(s, {{'<', "&lt;"},
                         {'>', "&gt;"},
                         {'&', "&amp;"},
                         {'[', "&#91;"},
                         {']', "&#93;"},
                         {'(', "&#40;"},
                         {')', "&#41;"},
                         {'\n', " "},
                         {'\r', " "}});
}

// Also inside an HTML block (<details>, a blank line after its summary): the table is
// Markdown there, and mdEscape keeps a cell's '<' from being markup.
void pipeTable(std::ostringstream& o, const Table& t) {
  const auto cell = [&](const std::string& s) { return mdEscape(s); };
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
  const auto ids = anchors({});
  for (const auto& b : blocks_) {
    switch (b.kind) {
      case Block::Kind::kHeading:
        o << std::string(b.level, '#') << " " << mdEscape(b.text) << "\n\n";
        break;
      case Block::Kind::kParagraph:
        o << mdEscape(b.text) << "\n\n";
        break;
      case Block::Kind::kList:
        for (const auto& i : b.items) o << "- " << mdEscape(i) << "\n";
        o << "\n";
        break;
      case Block::Kind::kImage:
        o << "![" << mdEscape(b.text) << "](" << b.path << ")\n\n";
        break;
      case Block::Kind::kTable:
        pipeTable(o, b.table);
        break;
      case Block::Kind::kToc: {
        o << "Contents:";
        const auto hs = sections(ids);
        for (size_t i = 0; i < hs.size(); ++i) {
          o << (i ? " · " : " ") << "[" << mdEscape(hs[i].first) << "](#" << hs[i].second << ")";
        }
        o << "\n\n";
        break;
      }
      case Block::Kind::kDetails:
        o << "<details><summary>" << htmlText(b.text) << "</summary>\n\n";  // HTML: escaped
        pipeTable(o, b.table);
        o << "</details>\n\n";
        break;
    }
  }
  return o.str();
}

}  // namespace sb::reports
