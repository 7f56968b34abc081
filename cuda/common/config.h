// Every HOCCL_* environment variable, in one table: its kind, default, allowed values and
// meaning. Each layer reads its settings through these functions, so a bad value fails the same
// way everywhere (an exception naming the variable), and HOCCL_DEBUG=INFO can print the whole
// configuration a group runs with. The README's configuration table lists the same rows.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace hoccl {
namespace config {

enum class Kind { Bytes, Integer, Choice, Text };
// When the variable is read: by the C++ core at run time, by hoccl's Python code, while
// building the extension, or by the test suite.
enum class ReadBy { Core, Python, Build, Tests };

struct Variable {
  const char* name;
  Kind kind;
  ReadBy readBy;
  const char* defaultValue;  // "auto": computed from the group or the machine (see meaning)
  const char* choices;       // Choice: comma-separated allowed values
  const char* meaning;
};

const std::vector<Variable>& table();
const Variable& variable(const std::string& name);  // throws for a name not in the table

// The variable's text (its default when unset or empty), checked against its kind.
std::string text(const std::string& name);
// Bytes (a number with an optional K/M/G suffix) or a plain integer. A default of "auto", when
// the variable is unset, yields autoValue. Values below minimum are rejected.
int64_t bytes(const std::string& name, int64_t autoValue = 0, int64_t minimum = 0);
int64_t integer(const std::string& name, int64_t autoValue = 0, int64_t minimum = 0);
// True when the user set the variable (to anything non-empty).
bool isSet(const std::string& name);

// Reads and checks every variable of the table that is set, and names HOCCL_* variables that
// are set but unknown (a typo would otherwise be ignored silently).
std::vector<std::string> unknownVariables();
void validateAll();
// One line per variable: name, value in force, and whether it came from the environment.
std::string describe();

}  // namespace config
}  // namespace hoccl
