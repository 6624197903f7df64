// main() for a fuzz harness built without libFuzzer (the GCC tree that
// tools/test.sh builds): replays every input of the given files and folders,
// then runs --runs N inputs made by mutating them (bit flips, byte changes,
// inserts, erasures, splices) with a fixed seed, so a run is reproducible.
// Coverage-guided fuzzing is tools/fuzz.sh (libFuzzer, ASan + UBSan); this
// keeps every harness and its seed corpus exercised by the test suite.
//
//   fuzz_codec [--runs N] [--seed S] PATH...
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

using Input = std::string;

bool ReadInputs(const std::filesystem::path& path, std::vector<Input>* inputs) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    std::vector<std::filesystem::path> files;
    for (const auto& entry : std::filesystem::directory_iterator(path, ec)) {
      if (entry.is_regular_file()) files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());  // the same order on every machine
    for (const auto& f : files) {
      if (!ReadInputs(f, inputs)) return false;
    }
    return !ec;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "fuzz: cannot read %s\n", path.c_str());
    return false;
  }
  inputs->emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return true;
}

// The input being run, written to ./fuzz-crash-input when it ends the
// process (abort, or a fatal signal), so that it can be replayed.
const Input* current = nullptr;

void SaveCurrentInput(int sig) {
  if (current != nullptr) {
    const int fd = open("fuzz-crash-input", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      (void)!write(fd, current->data(), current->size());
      close(fd);
    }
    static const char kSaved[] = "fuzz: the failing input is in ./fuzz-crash-input\n";
    (void)!write(2, kSaved, sizeof(kSaved) - 1);
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void Run(const Input& input) {
  current = &input;
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
}

Input Mutate(const std::vector<Input>& pool, std::mt19937_64& rng) {
  Input s = pool[rng() % pool.size()];
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    const size_t at = s.empty() ? 0 : rng() % s.size();
    switch (rng() % 6) {
      case 0:
        if (!s.empty()) s[at] = static_cast<char>(s[at] ^ (1u << (rng() % 8)));
        break;
      case 1:
        if (!s.empty()) s[at] = static_cast<char>(rng());
        break;
      case 2:  // interesting values: 0, 0xff, 0x7f, 0x80
        if (!s.empty()) s[at] = "\x00\xff\x7f\x80"[rng() % 4];
        break;
      case 3:
        s.insert(at, 1 + rng() % 8, static_cast<char>(rng()));
        break;
      case 4:
        if (!s.empty()) s.erase(at, 1 + rng() % 8);
        break;
      default: {  // splice the tail of another input
        const Input& other = pool[rng() % pool.size()];
        if (!other.empty()) s = s.substr(0, at) + other.substr(rng() % other.size());
      }
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  long runs = 0;
  uint64_t seed = 1;
  std::vector<Input> corpus;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if ((arg == "--runs" || arg == "--seed") && i + 1 < argc) {
      char* end = nullptr;
      const unsigned long long v = std::strtoull(argv[++i], &end, 10);
      if (*end != '\0') {
        std::fprintf(stderr, "fuzz: %s needs a number, not '%s'\n", arg.c_str(), argv[i]);
        return 2;
      }
      (arg == "--runs" ? runs = static_cast<long>(v) : seed = v);
    } else if (!ReadInputs(arg, &corpus)) {
      return 2;
    }
  }
  if (corpus.empty()) corpus.emplace_back();
  for (int sig : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) std::signal(sig, SaveCurrentInput);
  for (const Input& input : corpus) Run(input);
  std::mt19937_64 rng(seed);
  for (long r = 0; r < runs; ++r) Run(Mutate(corpus, rng));
  std::printf("fuzz: %zu corpus inputs and %ld mutated inputs ran without a failure\n", corpus.size(), runs);
  return 0;
}
