// A fixture for function_length_test.sh (never compiled): braces the scan must not count.
#include <string>

namespace fixture {

class Widget {
 public:
  explicit Widget(int n) : a_{n}, b_(n) {  // a constructor's braced initializer
    a_ += b_;
  }
  int get() const { return a_; }

 private:
  int a_;
  int b_;
};

extern "C" int c_entry(void) {
  return 0;
}

template <typename T>
std::string tricky(const T& value, const std::string& s = {}) {
  std::string out = s + "{ not a brace";
  out += '{';
  out += R"x(} nor this )x";
  // }
  /* { */
  const int n = 1'000;
  out += std::to_string(n + value);
  return out;
}

}  // namespace fixture
