// Suite files: what a valid one gives, and that every malformed one is rejected with the file,
// line and key.

#include <gtest/gtest.h>

#include <chrono>

#include <ATen/ATen.h>

#include "harness/hidden_text.h"
#include "harness/run/suite.h"
#include "reference/training.h"
#include "reference/workload.h"

namespace sb::harness {
namespace {

std::string errorOf(const std::string& yaml) {
  try {
    parseSuite(yaml, "bad.yaml");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

const char* kValid = R"(suite: demo
defaults:
  dtype: float64
  repetitions: 3
cases:
  - name: a
    workload: linear
    shape: {input: [4, 16], out_features: 8}
    mesh: 2x2
    strategies: ["sharding/linear/.*"]
  - name: b
    workload: linear
    shape: {input: [4, 16], out_features: 8, bias: false}
    mesh: [4]
    dtype: bfloat16
    inputs: exact
    strategies: sharding/linear/RR=RR.RR
)";

TEST(Suite, AValidSuiteAppliesDefaultsAndCaseOverrides) {
  const Suite s = parseSuite(kValid, "demo.yaml");
  EXPECT_EQ(s.name, "demo");
  ASSERT_EQ(s.cases.size(), 2u);
  EXPECT_EQ(s.cases[0].dtype, at::kDouble);
  EXPECT_EQ(s.cases[0].repetitions, 3);
  EXPECT_EQ(s.cases[0].mesh, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(s.cases[0].line, 6);
  EXPECT_EQ(s.cases[1].dtype, at::kBFloat16);
  EXPECT_EQ(s.cases[1].mesh, (std::vector<int64_t>{4}));
  EXPECT_EQ(s.cases[1].inputs, reference::InputMode::kExact);
  EXPECT_EQ(s.cases[1].strategies, (std::vector<std::string>{"sharding/linear/RR=RR.RR"}));
  EXPECT_EQ(s.cases[1].shape["bias"], false);
}

TEST(Suite, InvalidYamlNamesTheLine) {
  const auto e = errorOf("cases:\n  - name: [unclosed\n");
  EXPECT_NE(e.find("bad.yaml:"), std::string::npos) << e;
  EXPECT_NE(e.find("not valid YAML"), std::string::npos) << e;
}

TEST(Suite, AnUnknownKeyNamesTheFileLineAndKey) {
  const auto e = errorOf(
      "cases:\n  - name: a\n    workload: linear\n    shape: {input: [4, 4], "
      "out_features: 2}\n    mesh: 4\n    strategy: [x]\n");
  EXPECT_NE(e.find("bad.yaml:6"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown key 'strategy'"), std::string::npos) << e;
}

TEST(Suite, AMissingKeyIsNamed) {
  const auto e = errorOf(
      "cases:\n  - name: a\n    workload: linear\n    shape: {input: [4, 4], "
      "out_features: 2}\n    strategies: [x]\n");
  EXPECT_NE(e.find("bad.yaml:2"), std::string::npos) << e;
  EXPECT_NE(e.find("missing key 'mesh'"), std::string::npos) << e;
}

TEST(Suite, BadValuesNameTheKeyAndValue) {
  const std::string head = "cases:\n  - name: a\n    workload: linear\n    strategies: [x]\n";
  const std::string shape = "    shape: {input: [4, 4], out_features: 2}\n";
  auto e = errorOf(head + shape + "    mesh: 2y2\n");
  EXPECT_NE(e.find("bad.yaml:6"), std::string::npos) << e;
  EXPECT_NE(e.find("key 'mesh'"), std::string::npos) << e;
  e = errorOf(head + shape + "    mesh: 4\n    dtype: float8\n");
  EXPECT_NE(e.find("bad.yaml:7"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown dtype 'float8'"), std::string::npos) << e;
  e = errorOf(head + shape + "    mesh: 4\n    repetitions: many\n");
  EXPECT_NE(e.find("key 'repetitions' must be a whole number from 1 to 100000, got 'many'"),
            std::string::npos)
      << e;
  e = errorOf(head + shape + "    mesh: 4\n    inputs: integers\n");
  EXPECT_NE(e.find("key 'inputs' must be random or exact"), std::string::npos) << e;
  e = errorOf(head + shape + "    mesh: 4\n    device: gpu\n");
  EXPECT_NE(e.find("bad.yaml:7"), std::string::npos) << e;
  EXPECT_NE(e.find("key 'device' must be cpu or cuda (got 'gpu')"), std::string::npos) << e;
}

// A suite for GPU machines reads the same everywhere: whether a process can run its cases is
// the runner's question (it skips them, saying why, where there is no CUDA).
TEST(Suite, CudaCasesParseOnEveryBuild) {
  const Suite s = parseSuite(
      "defaults:\n  device: cuda\ncases:\n  - name: a\n    workload: linear\n    strategies: "
      "[x]\n    shape: {input: [4, 4], out_features: 2}\n    mesh: 4\n  - name: b\n    workload: "
      "linear\n    strategies: [x]\n    shape: {input: [4, 4], out_features: 2}\n    mesh: 4\n"
      "    device: cpu\n",
      "gpu.yaml");
  ASSERT_EQ(s.cases.size(), 2u);
  EXPECT_EQ(s.cases[0].device, "cuda");
  EXPECT_EQ(s.cases[1].device, "cpu");
}

TEST(Suite, AWrongShapeNamesTheShapeKey) {
  const std::string head =
      "cases:\n  - name: a\n    workload: linear\n    strategies: [x]\n"
      "    mesh: 4\n";
  auto e = errorOf(head + "    shape: {input: [4, 4]}\n");
  EXPECT_NE(e.find("bad.yaml:6"), std::string::npos) << e;
  EXPECT_NE(e.find("'out_features' is missing"), std::string::npos) << e;
  e = errorOf(head + "    shape: {input: [4, -4], out_features: 2}\n");
  EXPECT_NE(e.find("'input' must hold positive integers"), std::string::npos) << e;
  e = errorOf(head + "    shape: {input: [4, 4], out_features: 2, heads: 3}\n");
  EXPECT_NE(e.find("unknown shape key 'heads'"), std::string::npos) << e;
}

TEST(Suite, UnknownWorkloadDuplicateNamesAndNoCasesAreRejected) {
  const std::string unknown = errorOf("cases:\n  - name: a\n    workload: conv\n");
  EXPECT_NE(unknown.find("unknown workload 'conv'"), std::string::npos);
  // The error lists every workload a suite may name, and only those.
  for (const auto& w : sb::reference::workloadNames()) {
    EXPECT_NE(sb::reference::findWorkload(w), nullptr) << w;
    EXPECT_NE(unknown.find(w), std::string::npos) << w << " missing from: " << unknown;
  }
  for (const char* w : {"llama", "torchscript", "moe", "gpt2_prefill", "resnet18"}) {
    EXPECT_NE(unknown.find(w), std::string::npos) << w << " missing from: " << unknown;
  }
  EXPECT_NE(errorOf("suite: x\n").find("key 'cases' is missing"), std::string::npos);
  EXPECT_NE(errorOf("cases: []\n").find("non-empty list"), std::string::npos);
  const std::string c =
      "  - name: a\n    workload: linear\n    shape: {input: [4, 4], "
      "out_features: 2}\n    mesh: 4\n    strategies: [x]\n";
  EXPECT_NE(errorOf("cases:\n" + c + c).find("case name 'a' is used twice"), std::string::npos);
  EXPECT_NE(errorOf("sweet: smoke\ncases:\n" + c).find("unknown top-level key 'sweet'"),
            std::string::npos);
}

// Hostile and careless suites (issue 15): each is exit 2 naming the line and key, never a
// crash, a hang, a wrapped number or a setting silently dropped.
const char* kCase = R"(    workload: linear
    shape: {input: [4, 16], out_features: 8}
    mesh: 2x2
    strategies: ["sharding/linear/.*"]
)";

std::string oneCase(const std::string& extra, const std::string& name = "a") {
  return "cases:\n  - name: " + name + "\n" + kCase + extra;
}

TEST(SuiteHostile, NumbersAreCheckedForKindRangeNanAndInfinity) {
  EXPECT_NE(
      errorOf(oneCase("    min_time_s: .inf\n"))
          .find(
              "bad.yaml:7: key 'min_time_s' must be a number of seconds in (0, 3600], got '.inf'"),
      std::string::npos)
      << errorOf(oneCase("    min_time_s: .inf\n"));
  EXPECT_NE(errorOf(oneCase("    min_time_s: .nan\n")).find("min_time_s"), std::string::npos);
  EXPECT_NE(errorOf(oneCase("    seed: -5\n"))
                .find("key 'seed' must be a whole number from 0 to 18446744073709551615, got '-5'"),
            std::string::npos)
      << errorOf(oneCase("    seed: -5\n"));
  EXPECT_NE(errorOf(oneCase("    repetitions: 1e9\n")).find("key 'repetitions'"),
            std::string::npos);
  EXPECT_NE(errorOf(oneCase("    repetitions: 100001\n")).find("from 1 to 100000"),
            std::string::npos);
  EXPECT_EQ(parseSuite(oneCase("    seed: 18446744073709551615\n"), "ok.yaml").cases[0].seed,
            18446744073709551615ull);
  EXPECT_NE(errorOf("cases:\n  - name: a\n    workload: linear\n    shape: {input: [4, 16], "
                    "out_features: 8}\n    mesh: [4294967296, 4294967296]\n    strategies: [x]\n")
                .find("key 'mesh'"),
            std::string::npos);
}

TEST(SuiteHostile, DuplicateKeysAnywhereAreNamed) {
  EXPECT_NE(errorOf(oneCase("    mesh: 4\n")).find("bad.yaml:7: key 'mesh' is given twice"),
            std::string::npos)
      << errorOf(oneCase("    mesh: 4\n"));
  EXPECT_NE(errorOf(oneCase("    params: {budget: 0.5, budget: 0.9}\n"))
                .find("key 'budget' is given twice"),
            std::string::npos);
  EXPECT_NE(errorOf("suite: a\nsuite: b\n" + oneCase("")).find("key 'suite' is given twice"),
            std::string::npos);
}

TEST(SuiteHostile, ACaseLevelBackendIsRefusedNotIgnored) {
  EXPECT_NE(errorOf(oneCase("    backend: gloo\n")).find("the backend is chosen for the whole run"),
            std::string::npos);
  EXPECT_NE(errorOf("defaults: {backend: gloo}\n" + oneCase("")).find("key 'backend'"),
            std::string::npos);
}

TEST(SuiteHostile, AnAliasBombIsRefusedQuickly) {
  std::string yaml = "defaults:\n  params:\n    a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < 12; ++i) {
    yaml += "    a" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
    for (int k = 0; k < 10; ++k) yaml += std::string(k ? ", " : "") + "*a" + std::to_string(i - 1);
    yaml += "]\n";
  }
  yaml += oneCase("");
  const auto start = std::chrono::steady_clock::now();
  const std::string e = errorOf(yaml);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_NE(e.find("more than 1000000 values"), std::string::npos) << e;
}

TEST(SuiteHostile, DeepNestingAndHugeSweepsAreRefused) {
  std::string deep = "[";
  for (int i = 0; i < 40; ++i) deep += "[";
  deep += std::string(41, ']');
  EXPECT_NE(errorOf(oneCase("    params: {x: " + deep + "}\n")).find("nested deeper than 32"),
            std::string::npos);
  std::string sweep = "    sweep: {";
  for (int k = 0; k < 5; ++k) {
    sweep += std::string(k ? ", " : "") + "p" + std::to_string(k) + ": [";
    for (int v = 0; v < 10; ++v) sweep += std::string(v ? ", " : "") + std::to_string(v);
    sweep += "]";
  }
  sweep += "}\n";
  EXPECT_NE(errorOf(oneCase(sweep)).find("the sweep makes more than 10000 cases"),
            std::string::npos)
      << errorOf(oneCase(sweep));
}

TEST(SuiteHostile, TextMustBeUtf8AndNamesFreeOfControlCharacters) {
  const std::string bad = errorOf(oneCase("", "caf\xff"));
  EXPECT_NE(bad.find("not UTF-8 text: byte 0xff at offset 3"), std::string::npos) << bad;
  EXPECT_NE(errorOf(oneCase("", "\"two\\nlines\"")).find("control characters"), std::string::npos);
  EXPECT_NO_THROW(parseSuite(oneCase("", "caf\xc3\xa9"), "ok.yaml"));
}

// The one check of hidden characters the suite and results readers share: a name refuses
// what reads as something else (a zero-width space, a tab), a line of text what a terminal
// acts on (ESC, a direction override) but not an invisible space, a message line breaks too.
TEST(SuiteHostile, HiddenCharactersAreJudgedPerKindOfText) {
  using sb::harness::hiddenCharacter;
  using sb::harness::TextKind;
  const std::string zwsp = "smo\xe2\x80\x8bke", rlo = "a\xe2\x80\xaegpj", esc = "x\x1b[2J";
  const std::string nel = "x\xc2\x85";  // U+0085, a C1 control
  EXPECT_EQ(hiddenCharacter(zwsp, TextKind::kName).text(),
            "a Unicode control or invisible character U+200B at byte 3");
  EXPECT_FALSE(hiddenCharacter(zwsp, TextKind::kLine));
  for (const TextKind k : {TextKind::kName, TextKind::kLine, TextKind::kText}) {
    EXPECT_EQ(hiddenCharacter(rlo, k).text(), "a text-direction character U+202E at byte 1");
    EXPECT_EQ(hiddenCharacter(esc, k).text(), "the control character 0x1b at byte 1");
    EXPECT_EQ(hiddenCharacter(nel, k).text(), "a C1 control character U+0085 at byte 1");
    EXPECT_FALSE(hiddenCharacter("caf\xc3\xa9 \xe6\x97\xa5", k));  // é and a CJK character
  }
  EXPECT_TRUE(hiddenCharacter("a\tb", TextKind::kName));
  EXPECT_FALSE(hiddenCharacter("a\tb", TextKind::kLine));
  EXPECT_TRUE(hiddenCharacter("a\nb", TextKind::kLine));
  EXPECT_FALSE(hiddenCharacter("a\nb\r\n", TextKind::kText));
  EXPECT_EQ(hiddenCharacter("ok\x7f", TextKind::kText).text(),
            "the control character 0x7f at byte 2");
  // Unicode's default-ignorables and blanks a sweep of names found accepted: a tag, variation
  // selectors, the combining grapheme joiner, Hangul fillers, a Khmer inherent vowel, musical
  // formatting, a deprecated format character, the braille blank, a noncharacter.
  const auto utf8 = [](uint32_t cp) {
    std::string s;
    if (cp < 0x800) {
      s += static_cast<char>(0xC0 | (cp >> 6));
    } else if (cp < 0x10000) {
      s += static_cast<char>(0xE0 | (cp >> 12));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    } else {
      s += static_cast<char>(0xF0 | (cp >> 18));
      s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    }
    return s + static_cast<char>(0x80 | (cp & 0x3F));
  };
  for (const uint32_t cp : {0xE0001u, 0xE007Fu, 0xE0100u, 0xFE00u, 0x34Fu, 0x115Fu, 0x3164u,
                            0x17B4u, 0x1D173u, 0x206Au, 0x2800u, 0xFFFFu, 0x180Bu, 0xFE0Fu}) {
    const auto h = hiddenCharacter("li" + utf8(cp) + "n", TextKind::kName);
    EXPECT_TRUE(h) << std::hex << cp;
    EXPECT_EQ(h.byte, 2u) << std::hex << cp;
  }
  // Letters, a combining accent and symbols that show as themselves stay names.
  for (const uint32_t cp : {0x3A9u, 0xDFu, 0x301u, 0x1F680u, 0x4E2Du, 0x1100u, 0xFF21u}) {
    EXPECT_FALSE(hiddenCharacter("a" + utf8(cp), TextKind::kName)) << std::hex << cp;
  }
  // An emoji with the presentation selector keyboards add to it ("❤️"): a name.
  EXPECT_FALSE(hiddenCharacter("run " + utf8(0x2764) + utf8(0xFE0F), TextKind::kName));
}

// Found by ci/fuzz/suite_fuzz.cpp: a sweep's values become part of the case names, so a value
// holding a control character made a name no result file could hold.
TEST(SuiteHostile, ASweepValueCannotPutAControlCharacterIntoACaseName) {
  const std::string e = errorOf(oneCase("    sweep: {budget: [0.5, \"\\x01x\"]}\n"));
  EXPECT_NE(e.find("case 'a': the name its sweep makes must not hold control characters"),
            std::string::npos)
      << e;
}

// A sweep over a key the same case's params give: every swept case replaced the params' value
// in silence. A case's sweep over a default param varies the default, as meant.
TEST(SuiteHostile, ASweepOverAKeyItsParamsAlsoGiveIsRefused) {
  const std::string e =
      errorOf(oneCase("    params: {budget: 0.9}\n    sweep: {budget: [0.5, 0.6]}\n"));
  EXPECT_NE(e.find("case 'a': key 'sweep': 'budget' is also in the case's params"),
            std::string::npos)
      << e;
  const std::string d =
      errorOf("defaults:\n  params: {budget: 0.9}\n  sweep: {budget: [0.5]}\n" + oneCase(""));
  EXPECT_NE(d.find("'budget' is also in the defaults' params"), std::string::npos) << d;
  EXPECT_EQ(errorOf("defaults:\n  params: {budget: 0.9}\n" +
                    oneCase("    sweep: {budget: [0.5, 0.6]}\n")),
            "");
  EXPECT_EQ(errorOf(oneCase("    params: {chunk: 4}\n    sweep: {budget: [0.5, 0.6]}\n")), "");
}

// A quoted value is text: `steps: '2'` or `params: {budget: '0.5'}` was read as the number.
TEST(SuiteHostile, QuotedNumbersAreTextNotNumbers) {
  const std::string e = errorOf(oneCase("    seed: '7'\n"));
  EXPECT_NE(e.find("key 'seed' must be a whole number from 0 to 18446744073709551615, not the "
                   "quoted text '7'"),
            std::string::npos)
      << e;
  EXPECT_NE(errorOf(oneCase("    repetitions: \"3\"\n")).find("not the quoted text '3'"),
            std::string::npos);
  const Suite s =
      parseSuite(oneCase("    params: {budget: '0.5', n: 0.5, on: 'true'}\n"), "ok.yaml");
  EXPECT_TRUE(s.cases.at(0).params.at("budget").is_string());
  EXPECT_TRUE(s.cases.at(0).params.at("n").is_number());
  EXPECT_TRUE(s.cases.at(0).params.at("on").is_string());
}

// A tag asks for a conversion the reader does not make: refused, not dropped in silence.
TEST(SuiteHostile, YamlTagsAreRefusedNamingThem) {
  const std::string e = errorOf(oneCase("    seed: !!binary AAAA\n"));
  EXPECT_NE(e.find("the YAML tag '!!binary' is not read"), std::string::npos) << e;
  EXPECT_NE(errorOf(oneCase("    params: !custom {chunk: 4}\n")).find("the YAML tag '!custom'"),
            std::string::npos);
  EXPECT_NE(errorOf(oneCase("    !!str seed: 3\n")).find("the YAML tag '!!str'"),
            std::string::npos);
  // Quoted and plain values carry no tag of their own.
  EXPECT_EQ(errorOf(oneCase("    params: {note: 'text', other: \"more\"}\n")), "");
}

TEST(SuiteHostile, NanAndInfinityInParamsStayTextThatNoNumberReaderAccepts) {
  const auto s = parseSuite(oneCase("    params: {budget: nan, chunk: inf, x: 1.5}\n"), "ok.yaml");
  EXPECT_TRUE(s.cases[0].params["budget"].is_string());
  EXPECT_TRUE(s.cases[0].params["chunk"].is_string());
  EXPECT_EQ(s.cases[0].params["x"].get<double>(), 1.5);
}

TEST(Suite, AMissingFileIsAnInputError) {
  EXPECT_THROW(loadSuite("/nonexistent/suite.yaml"), InputError);
}

const char* kScheduled = R"(suite: sched
cases:
  - name: c
    workload: mlp
    shape: {batch: 4, d_model: 8, layers: 1}
    mesh: 2
    steps: 5
    optimizer: {kind: sgd, lr: 0.1, schedule: {warmup_steps: 2, decay: cosine, min_lr: 0.02}}
    strategies: ["sharding/fsdp/.*"]
)";

TEST(TrainingSchedule, ParsedFromTheSuiteAndRunByTheLoop) {
  const Suite s = parseSuite(kScheduled, "sched.yaml");
  const auto& spec = s.cases.at(0).training;
  ASSERT_TRUE(spec.optimizer.scheduled());
  EXPECT_EQ(spec.optimizer.warmupSteps, 2);
  EXPECT_EQ(spec.optimizer.decay, "cosine");
  // Plain SGD: each update moves the parameter by exactly lr_k times its gradient (1 here, a
  // power of two below lr's scale), so the loop's learning rates can be read back from it.
  at::Tensor p = at::zeros({1}, at::kDouble).requires_grad_(true);
  reference::TrainingLoop loop(spec, {{"p", p}});
  std::vector<double> seen;
  for (int k = 0; k < spec.steps; ++k) {
    const double before = p.item<double>();
    p.mutable_grad() = at::ones({1}, at::kDouble);
    loop.update(0);
    seen.push_back(before - p.item<double>());
  }
  // torchtitan's warmup, (k + 1) / (warmup + 1), then cosine from lr to min_lr over the rest.
  const double pi = std::acos(-1.0);
  const std::vector<double> want = {0.1 / 3, 0.2 / 3, 0.1,
                                    0.02 + 0.08 * 0.5 * (1 + std::cos(pi / 3)),
                                    0.02 + 0.08 * 0.5 * (1 + std::cos(2 * pi / 3))};
  for (size_t k = 0; k < want.size(); ++k) EXPECT_NEAR(seen[k], want[k], 1e-15) << "update " << k;
}

TEST(TrainingSchedule, MalformedSchedulesNameTheKey) {
  const auto with = [](const std::string& schedule) {
    std::string y = kScheduled;
    const std::string from = "{warmup_steps: 2, decay: cosine, min_lr: 0.02}";
    y.replace(y.find(from), from.size(), schedule);
    return errorOf(y);
  };
  EXPECT_NE(with("{decay: step}").find("'decay' must be none, linear or cosine"),
            std::string::npos);
  EXPECT_NE(with("{warmup_steps: 1.5}").find("'warmup_steps' must be a whole number"),
            std::string::npos);
  EXPECT_NE(with("{warmup: 1}").find("unknown key 'warmup'"), std::string::npos);
  EXPECT_NE(with("{min_lr: 0.5}").find("min_lr 0.500000 is above lr 0.100000"), std::string::npos);
  EXPECT_NE(with("cosine").find("'schedule' must be a mapping"), std::string::npos);
}

}  // namespace
}  // namespace sb::harness
