// Building a report's document (document.h); rendering it is one file per renderer.

#include "reports/document.h"

#include <set>
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

void Document::toc() { blocks_.emplace_back(Block::Kind::kToc); }

std::string Document::anchor(const std::string& text) {
  std::string a;
  for (unsigned char c : text) {
    if (c >= 'A' && c <= 'Z') {
      a += static_cast<char>(c - 'A' + 'a');
    } else if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_') {
      a += static_cast<char>(c);
    } else if (c == ' ') {
      a += '-';
    } else if (c >= 0x80) {
      a += static_cast<char>(c);  // GitHub keeps letters beyond ASCII
    }
  }
  return a;
}

std::vector<std::string> Document::anchors(const std::vector<std::string>& reserved) const {
  std::set<std::string> used(reserved.begin(), reserved.end());
  std::vector<std::string> out;
  for (const auto& b : blocks_) {
    if (b.kind != Block::Kind::kHeading) {
      out.emplace_back();
      continue;
    }
    const std::string base = anchor(b.text);
    std::string a = base;
    for (int n = 1; used.count(a); ++n) a = base + "-" + std::to_string(n);
    used.insert(a);
    out.push_back(a);
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> Document::sections(
    const std::vector<std::string>& anchors) const {
  std::vector<std::pair<std::string, std::string>> out;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const Block& b = blocks_[i];
    if (b.kind == Block::Kind::kHeading && b.level == 2) out.emplace_back(b.text, anchors[i]);
  }
  return out;
}

void Document::image(std::string path, std::string alt) {
  Block b(Block::Kind::kImage);
  b.path = std::move(path);
  b.text = std::move(alt);
  blocks_.push_back(std::move(b));
}

}  // namespace sb::reports
