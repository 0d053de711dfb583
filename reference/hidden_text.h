#pragma once

// What a name or a text must not hold, because a terminal or a page would act on it or show it
// as something else: one check shared by the suite reader (suite, case names), the results
// reader (every column of a results.csv) and the importer (a model's parameter and buffer
// names, which every row prints). Header-only and LibTorch-free; in reference/, the lowest room
// that reads names (as json_strict.h), and brought into sb::harness by harness/hidden_text.h.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>

namespace sb::reference {

enum class TextKind {
  // A name (a suite, a case, a strategy id): no control character at all (a tab, a newline),
  // and none of Unicode's controls, invisible or text-direction characters: C1 (U+0080-009F),
  // every default-ignorable code point of Unicode (the soft hyphen, the combining grapheme
  // joiner, the Arabic letter mark, Hangul fillers, Khmer inherent vowels, Mongolian variation
  // selectors, zero-width spaces and joiners, direction marks, embeddings, overrides and
  // isolates, word joiners and invisible operators, variation selectors, the byte-order mark,
  // musical formatting, tags U+E0000-E0FFF), line and paragraph separators, the braille blank
  // (U+2800), interlinear annotations (U+FFF9-FFFB) and the noncharacters (U+FDD0-FDEF and
  // U+xFFFE/xFFFF); the emoji and text presentation selectors U+FE0E/FE0F only after a
  // non-ASCII character (keyboards add U+FE0F to emoji). Each makes a name show as another
  // ("a<RLO>gpj.exe", "smoke" and
  // "smo<ZWSP>ke", "li<TAG>n").
  kName,
  // One line of text (a shape, a host, parameters): no C0 control but the tab (ESC starts a
  // terminal sequence, BEL ends an OSC-8 link), no DEL, no C1 control and no text-direction
  // mark, override or isolate (U+061C, U+200E/F, U+202A-202E, U+2066-2069).
  kLine,
  // Text of several lines (a message): as kLine, with line breaks.
  kText,
};

// The first such character of `s`: what it is ("the control character", "a text-direction
// character", ...), its code ("0x1b", "U+202E") and its byte. `s` is taken as UTF-8; a malformed
// sequence is left to the readers' own UTF-8 checks.
struct HiddenCharacter {
  std::string what;  // empty where `s` holds none
  std::string code;
  size_t byte = 0;
  explicit operator bool() const { return !what.empty(); }
  // "a text-direction character U+202E at byte 5"
  std::string text() const { return what + " " + code + " at byte " + std::to_string(byte); }
};

// The code point whose UTF-8 sequence starts at s[i], and its length in bytes (`len`); a
// malformed sequence decoded as far as it goes (the readers' own UTF-8 checks refuse it).
inline uint32_t codePointAt(const std::string& s, size_t i, size_t& len) {
  const auto u = static_cast<unsigned char>(s[i]);
  len = u < 0x80 ? 1 : u >= 0xF0 ? 4 : u >= 0xE0 ? 3 : 2;
  uint32_t cp = len == 1 ? u : u & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < len && i + k < s.size(); ++k) {
    cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  }
  return cp;
}

inline HiddenCharacter hiddenCharacter(const std::string& s, TextKind kind) {
  for (size_t i = 0; i < s.size(); ++i) {
    const auto u = static_cast<unsigned char>(s[i]);
    const bool lineBreak = u == '\n' || u == '\r';
    const bool allowed =
        kind != TextKind::kName && (u == '\t' || (kind == TextKind::kText && lineBreak));
    if ((u < 0x20 && !allowed) || u == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", u);
      return {"the control character", hex, i};
    }
    if (u < 0xC0) continue;
    size_t len = 0;
    const uint32_t cp = codePointAt(s, i, len);
    const bool direction = cp == 0x61C || cp == 0x200E || cp == 0x200F ||
                           (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069);
    // Unicode's default-ignorable code points (DerivedCoreProperties.txt: shown as nothing),
    // the characters drawn blank that are no space (Hangul fillers, the braille blank), the
    // interlinear annotations and the noncharacters.
    const bool invisible =
        cp == 0xAD || cp == 0x34F || cp == 0x61C || cp == 0x115F || cp == 0x1160 || cp == 0x17B4 ||
        cp == 0x17B5 || (cp >= 0x180B && cp <= 0x180F) || (cp >= 0x200B && cp <= 0x200F) ||
        (cp >= 0x2028 && cp <= 0x202E) || (cp >= 0x2060 && cp <= 0x206F) || cp == 0x2800 ||
        cp == 0x3164 || (cp >= 0xFDD0 && cp <= 0xFDEF) || (cp >= 0xFE00 && cp <= 0xFE0F) ||
        cp == 0xFEFF || cp == 0xFFA0 || (cp >= 0xFFF0 && cp <= 0xFFFB) || (cp & 0xFFFE) == 0xFFFE ||
        (cp >= 0x1BCA0 && cp <= 0x1BCA3) || (cp >= 0x1D173 && cp <= 0x1D17A) ||
        (cp >= 0xE0000 && cp <= 0xE0FFF);
    // The emoji and text presentation selectors after a character that has those forms (never
    // after ASCII, where "li<VS16>n" reads as "lin"): keyboards put U+FE0F after most emoji.
    const bool presentation =
        (cp == 0xFE0E || cp == 0xFE0F) && i > 0 && static_cast<unsigned char>(s[i - 1]) >= 0x80;
    const bool c1 = cp >= 0x80 && cp <= 0x9F;
    if (c1 || direction || (kind == TextKind::kName && invisible && !presentation)) {
      char hex[16];
      std::snprintf(hex, sizeof hex, "U+%04X", static_cast<unsigned>(cp));
      return {c1          ? "a C1 control character"
              : direction ? "a text-direction character"
                          : "a Unicode control or invisible character",
              hex, i};
    }
  }
  return {};
}

// `s` with every character hiddenCharacter finds for `kind` written as an escape ("\\u202e",
// "\\u001b"): a message that quotes what it refuses shows it, and the terminal acts on none.
inline std::string escapeHidden(const std::string& s, TextKind kind) {
  std::string out;
  size_t at = 0;
  while (at < s.size()) {
    const HiddenCharacter h = hiddenCharacter(s.substr(at), kind);
    if (!h) break;
    const size_t i = at + h.byte;
    size_t len = 0;
    const uint32_t cp = codePointAt(s, i, len);
    char esc[16];
    std::snprintf(esc, sizeof esc, cp > 0xFFFF ? "\\U%08x" : "\\u%04x", static_cast<unsigned>(cp));
    out += s.substr(at, i - at) + esc;
    at = i + len;
  }
  return out + s.substr(std::min(at, s.size()));
}

// Where `text` is not UTF-8 (a malformed, overlong or surrogate sequence, or past U+10FFFF): the
// offset of the first bad byte, or -1.
inline int64_t firstInvalidUtf8(const std::string& text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    size_t len = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return static_cast<int64_t>(i);
    }
    if (i + len > n) return static_cast<int64_t>(i);
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return static_cast<int64_t>(i);
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    const bool overlong =
        (len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000);
    if (overlong || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return static_cast<int64_t>(i);
    }
    i += len;
  }
  return -1;
}

}  // namespace sb::reference
