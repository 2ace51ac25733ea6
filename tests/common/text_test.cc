// common/text.h: trimming and comma lists of settings.
#include "common/text.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace gflow {
namespace {

TEST(Text, TrimDropsSpacesTabsAndLineEnds) {
  EXPECT_EQ(text::trim(" \t eth0 \r\n"), "eth0");
  EXPECT_EQ(text::trim("a b"), "a b");
  EXPECT_EQ(text::trim(" \t\r\n"), "");
  EXPECT_EQ(text::trim(""), "");
}

TEST(Text, SplitListTrimsItemsAndDropsEmptyOnes) {
  EXPECT_EQ(text::splitList("float32, bfloat16 ,,qint8 "),
            (std::vector<std::string>{"float32", "bfloat16", "qint8"}));
  EXPECT_EQ(text::splitList("a:b:", ':'), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(text::splitList(" , ,").empty());
  EXPECT_TRUE(text::splitList("").empty());
}

}  // namespace
}  // namespace gflow
