// crash_handler.cpp — see crash_handler.h.
#include "crash_handler.h"

#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstring>
#include <initializer_list>

#include "signal_name.h"
#include "whereabouts.h"

namespace ddp {
namespace {

int g_rank = -1;

// A fixed buffer that text is appended to, cut short when full.
struct Line {
  char text[2048];
  size_t size = 0;
  void add(const char* s) {
    while (*s && size + 1 < sizeof text) text[size++] = *s++;
  }
  void add_int(int64_t v) {
    char digits[24];
    size_t n = 0;
    const bool negative = v < 0;
    uint64_t u = negative ? uint64_t(-(v + 1)) + 1 : uint64_t(v);
    do {
      digits[n++] = char('0' + u % 10);
      u /= 10;
    } while (u > 0);
    if (negative) add("-");
    while (n > 0 && size + 1 < sizeof text) text[size++] = digits[--n];
  }
  // A JSON string's contents: quotes, backslashes and control characters escaped.
  void add_json(const char* s) {
    for (; *s; ++s) {
      const unsigned char c = static_cast<unsigned char>(*s);
      if (c == '"' || c == '\\') {
        const char escaped[3] = {'\\', char(c), '\0'};
        add(escaped);
      } else if (c < 0x20) {
        add(" ");
      } else {
        const char plain[2] = {char(c), '\0'};
        add(plain);
      }
    }
  }
};

// "<plugin> crashed in <entry>", "crashed in the engine (<what it was
// doing>)", "crashed in the engine", or, on a thread no plugin entry or host
// function runs on (Gloo's own), "crashed on a thread of a library, outside
// any plugin entry"; for stderr, with the signal's name
// (on the channel the launcher names it).
void describe(Line& line, int sig, bool json) {
  const char* plugin = whereabouts::plugin();
  const char* entry = whereabouts::entry();
  auto text = [&](const char* s) { json ? line.add_json(s) : line.add(s); };
  if (plugin) {
    text(plugin);
    line.add(" crashed in ");
    text(entry ? entry : "an entry");
  } else if (!whereabouts::on_training_thread()) {
    line.add("crashed on a thread of a library, outside any plugin entry");
  } else {
    line.add("crashed in the engine");
    if (entry) {
      line.add(" (");
      text(entry);
      line.add(")");
    }
  }
  if (json) return;
  line.add(" (");
  line.add(signal_name(sig));
  line.add(")");
}

void report(int sig) {
  Line line;
  const int64_t step = whereabouts::step();
  if (whereabouts::has_channel()) {
    line.add("failure {\"kind\":\"internal\",\"rank\":");
    line.add_int(g_rank);
    line.add(",\"step\":");
    line.add_int(step);
    line.add(",\"plugin\":\"");
    if (whereabouts::plugin()) line.add_json(whereabouts::plugin());
    line.add("\",\"entry\":\"");
    if (whereabouts::entry()) line.add_json(whereabouts::entry());
    line.add("\",\"message\":\"");
    describe(line, sig, /*json=*/true);
    line.add("\",\"signal\":");
    line.add_int(sig);
    line.add("}\n");
    whereabouts::send_line(line.text, line.size);
    return;
  }
  line.add("ddp: rank ");
  line.add_int(g_rank);
  line.add(": error: ");
  describe(line, sig, /*json=*/false);
  if (step >= 0) {
    line.add(" in step ");
    line.add_int(step + 1);
  }
  line.add("\n");
  const ssize_t ignored = write(STDERR_FILENO, line.text, line.size);
  (void)ignored;
}

void on_crash(int sig) {
  report(sig);
  signal(sig, SIG_DFL);  // SA_RESETHAND did too; said again for raise()'s sake
  raise(sig);
}

}  // namespace

void install_crash_handler(int rank) {
  g_rank = rank;
  static char alt_stack[64 * 1024];
  stack_t ss{};
  ss.ss_sp = alt_stack;
  ss.ss_size = sizeof alt_stack;
  sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_handler = on_crash;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND | SA_ONSTACK | SA_NODEFER;
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) sigaction(sig, &sa, nullptr);
}

}  // namespace ddp
