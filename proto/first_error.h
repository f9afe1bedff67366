// The first error protobuf's text parser reports, with its position, so that a config or a
// fault schedule with a typo is refused as `file:line:col: message` (protobuf counts lines and
// columns from 0; add 1 to show them).
#pragma once

#include <google/protobuf/io/tokenizer.h>

#include <string>

namespace keel {

class FirstErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (!has_error) {
      has_error = true;
      this->line = line;
      this->column = column;
      this->message = message;
    }
  }
  bool has_error = false;
  int line = -1;
  int column = -1;
  std::string message;
};

}  // namespace keel
