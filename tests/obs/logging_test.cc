// --log_format: the JSON line format and the format switch.
#include "sluice/core/logging.h"

#include <algorithm>
#include <regex>
#include <sstream>

#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"
#include "tests/test_util.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

class LogFormatTest : public ::testing::Test {
 protected:
  void SetUp() override {
    previous_ = spdlog::default_logger();
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out_);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("test", sink));
  }
  void TearDown() override {
    spdlog::set_default_logger(previous_);
    ASSERT_OK(SetLogFormat("text"));
  }
  std::string Take() {
    std::string s = out_.str();
    out_.str("");
    return s;
  }
  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> previous_;
};

TEST_F(LogFormatTest, JsonLinesCarryTimeLevelComponentAndEscapedMessage) {
  ASSERT_OK(SetLogFormat("json", "sluice-test"));
  spdlog::warn("say \"hi\"\\ \n\t{}", std::string("\x01 caf\xc3\xa9 bad\xff end"));
  std::string line = Take();
  EXPECT_TRUE(std::regex_match(
      line, std::regex(R"(\{"time":"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:)"
                       R"([0-9]{2}\.[0-9]{6}Z","level":"warning","component":)"
                       R"("sluice-test","pid":[0-9]+,"thread":[0-9]+,"message":[^\n]*\}\n)")))
      << line;
  EXPECT_THAT(line, HasSubstr("\"message\":\"say \\\"hi\\\"\\\\ \\n\\t\\u0001 caf\xc3\xa9 bad"
                              "\xef\xbf\xbd end\"}\n"));
  EXPECT_EQ(std::count(line.begin(), line.end(), '\n'), 1);
}

TEST_F(LogFormatTest, TextIsTheDefaultAndUnknownFormatsAreRejected) {
  ASSERT_OK(SetLogFormat("text"));
  spdlog::info("plain");
  std::string line = Take();
  EXPECT_TRUE(std::regex_match(line, std::regex(R"(\[[^\]]+\] \[test\] \[info\] plain\n)")))
      << line;
  EXPECT_STATUS(SetLogFormat("xml"), absl::StatusCode::kInvalidArgument, "expected text or json");
}

}  // namespace
}  // namespace sluice
