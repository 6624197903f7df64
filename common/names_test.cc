#include "common/names.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace shardps {
namespace {

using ::testing::HasSubstr;

TEST(NamesTest, CountedSaysOneInTheSingularAndEveryOtherCountInThePlural) {
  EXPECT_EQ(Counted(1, "copy", "copies"), "1 copy");
  EXPECT_EQ(Counted(0, "copy", "copies"), "0 copies");
  EXPECT_EQ(Counted(3, "partition", "partitions"), "3 partitions");
}

TEST(NamesTest, Utf8PrefixStopsAtTheFirstByteThatBreaksTheEncoding) {
  EXPECT_EQ(Utf8Prefix(""), 0u);
  EXPECT_EQ(Utf8Prefix("fc1.weight"), 10u);
  EXPECT_EQ(Utf8Prefix("\xc3\xa9t\xc3\xa9"), 5u);        // "été"
  EXPECT_EQ(Utf8Prefix("\xf0\x9f\x98\x80"), 4u);         // U+1F600, four bytes
  EXPECT_EQ(Utf8Prefix("w\xff"), 1u);                    // not a lead byte
  EXPECT_EQ(Utf8Prefix("ab\xc3"), 2u);                   // cut short
  EXPECT_EQ(Utf8Prefix("a\xc0\xaf"), 1u);                // overlong '/'
  EXPECT_EQ(Utf8Prefix("a\xed\xa0\x80"), 1u);            // a surrogate, U+D800
  EXPECT_EQ(Utf8Prefix("a\xf4\x90\x80\x80"), 1u);        // past U+10FFFF
  EXPECT_EQ(Utf8Prefix("a\xe2\x28\xa1"), 1u);            // a continuation byte missing
}

TEST(NamesTest, CheckNameSaysWhatAndWhyAndKeepsLongNamesOutOfTheMessage) {
  EXPECT_TRUE(CheckName("tensor name", "fc1.weight").ok());
  EXPECT_TRUE(CheckName("tensor name", std::string(kMaxNameBytes, 'a')).ok());
  absl::Status s = CheckName("barrier name", "b\xff");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("barrier name 'b\\xff' is not UTF-8 (byte 1 breaks it)"));
  s = CheckName("tensor name", std::string(kMaxNameBytes + 1, 'a'));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("is 4097 bytes long; at most 4096"));
  EXPECT_LT(s.message().size(), 100u);
}

TEST(NamesTest, ToUtf8ReplacesBrokenBytesAndCutsBetweenCharacters) {
  EXPECT_EQ(ToUtf8("caf\xc3\xa9", 100), "caf\xc3\xa9");
  EXPECT_EQ(ToUtf8("caf\xe9 ok", 100), "caf\xef\xbf\xbd ok");  // Latin-1, one byte replaced
  EXPECT_EQ(ToUtf8("caf\xc3\xa9", 4), "caf");                 // not half of the "é"
  EXPECT_EQ(ToUtf8("ab\xff", 4), "ab");                       // no room for U+FFFD
  EXPECT_EQ(ToUtf8("\xff\xfe", 6), "\xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(ToUtf8("abc", 0), "");
}

}  // namespace
}  // namespace shardps
