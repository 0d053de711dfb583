// Building a report's document (document.h); rendering it is one file per renderer.

#include "reports/document.h"

#include <utility>

namespace sb::reports {

void Document::heading(int level, std::string text) {
  Block b(Block::Kind::kHeading);
  b.level = level;
  b.text = std::move(text);
  blocks_.push_back(std::move(b));
}

void Document::paragraph(std::string text, std::string cls) {
  Block b(Block::Kind::kParagraph);
  b.text = std::move(text);
  b.cls = std::move(cls);
  blocks_.push_back(std::move(b));
}

void Document::table(Table t) {
  Block b(Block::Kind::kTable);
  b.table = std::move(t);
  blocks_.push_back(std::move(b));
}

void Document::list(std::vector<std::string> items) {
  if (items.empty()) return;
  Block b(Block::Kind::kList);
  b.items = std::move(items);
  blocks_.push_back(std::move(b));
}

void Document::details(std::string summary, Table t, std::string cls) {
  Block b(Block::Kind::kDetails);
  b.text = std::move(summary);
  b.table = std::move(t);
  b.cls = std::move(cls);
  blocks_.push_back(std::move(b));
}

void Document::image(std::string path, std::string alt) {
  Block b(Block::Kind::kImage);
  b.path = std::move(path);
  b.text = std::move(alt);
  blocks_.push_back(std::move(b));
}

}  // namespace sb::reports
