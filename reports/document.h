#pragma once

// The report as a document: headings, paragraphs, tables, lists and images, in order, built
// once by report.cpp and rendered by each renderer (render_markdown.cpp, render_html.cpp), as
// google/benchmark's reporters each render one run. Internal to reports/.

#include <string>
#include <utility>
#include <vector>

namespace sb::reports {

// ---- a small document model, rendered both as Markdown and as HTML --------------------------

struct Cell {
  std::string text;
  std::string cls;  // a status or verdict: colours the HTML cell
};

struct Table {
  std::vector<std::string> head;
  std::vector<std::vector<Cell>> rows;
  std::string id;  // HTML id, for the browser test and for links
};

struct Block {
  enum class Kind { kHeading, kParagraph, kTable, kList, kImage, kDetails, kToc };
  explicit Block(Kind k) : kind(k) {}
  Kind kind;
  int level = 2;
  std::string text;  // heading / paragraph text, image alt, a collapsed table's summary
  std::string path;  // image path relative to the report
  std::string cls;   // paragraph class (e.g. "gate-fail")
  Table table;
  std::vector<std::string> items;
};

class Document {
 public:
  void heading(int level, std::string text);
  void paragraph(std::string text, std::string cls = "");
  void table(Table t);
  void list(std::vector<std::string> items);
  void image(std::string path, std::string alt);
  // A table shown on request: HTML's <details> with `summary` as its one visible line (in
  // Markdown the same element, which GitHub renders). `cls` colours the summary (e.g. "fail").
  void details(std::string summary, Table t, std::string cls = "");
  // A table of contents: a link to every level-2 heading of the whole document, rendered where
  // it stands (headings added after it included).
  void toc();
  // The anchor of a heading's text, as GitHub makes it for Markdown (lower case, letters,
  // digits, '-' and '_' kept, spaces to '-') and as the HTML renderer sets its id.
  static std::string anchor(const std::string& text);
  // Each block's anchor (empty for a block that is not a heading): anchor(text), and where an
  // earlier heading or a `reserved` id (HTML: the tables' ids) has it, "-1", "-2", ... added,
  // as GitHub numbers repeated headings.
  std::vector<std::string> anchors(const std::vector<std::string>& reserved) const;
  // Level-2 headings, in order, with their anchors from `anchors` (for the table of contents).
  std::vector<std::pair<std::string, std::string>> sections(
      const std::vector<std::string>& anchors) const;

  // Markdown: tables as pipe tables, images as links to their files (render_markdown.cpp).
  std::string markdown() const;
  // Self-contained: styles inline, every image a data: URI. A script counts the images that
  // decoded, so a headless browser can check that every plot loads (render_html.cpp).
  std::string html(const std::string& title, const std::string& baseDir) const;

 private:
  std::vector<Block> blocks_;
};

}  // namespace sb::reports
