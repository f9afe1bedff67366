// Debian's libglog has the custom-prefix entry points; its header shows them only with this.
#define GLOG_CUSTOM_PREFIX_SUPPORT 1
#include "runtime/logging.h"

#include <cstdio>
#include <mutex>
#include <string>

namespace keel {
namespace {

std::string& program_name() {
  static std::string name;
  return name;
}

void prefix(std::ostream& s, const google::LogMessageInfo& m, void*) {
  char t[32];
  std::snprintf(t, sizeof t, "%02d:%02d:%02d.%03d", m.time.hour(), m.time.min(), m.time.sec(),
                m.time.usec() / 1000);
  // Only the file's name: the full path of the build tree says nothing to an operator.
  std::string file = m.filename;
  file = file.substr(file.rfind('/') + 1);
  s << program_name() << ' ' << m.severity[0] << ' ' << t << ' ' << file << ':' << m.line_number
    << ']';
}

}  // namespace

void init_logging(const char* program) {
  static std::once_flag once;
  std::call_once(once, [program] {
    std::string p = program ? program : "keel";
    program_name() = p.substr(p.rfind('/') + 1);
    FLAGS_logtostderr = true;
    FLAGS_colorlogtostderr = false;
    google::InitGoogleLogging(program_name().c_str(), &prefix, nullptr);
  });
}

}  // namespace keel
