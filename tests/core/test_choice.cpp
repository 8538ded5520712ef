// Configuration choices (core/choice.h): one X-macro list gives the enum, the names, the parser
// whose error lists the valid names, and the comma-separated sets.
#include <gtest/gtest.h>

#include <string>

#include "core/choice.h"

namespace loom {
namespace {

#define TEST_FRUITS(X) \
  X(apple, "red")      \
  X(pear, "green")     \
  X(static_, "a keyword")
LOOM_CHOICE(Fruit, "fruit", TEST_FRUITS)

TEST(Choice, NamesComeFromTheList) {
  EXPECT_EQ(choices_of(Fruit{}).size(), 3u);
  EXPECT_EQ(choice_name(Fruit::apple), "apple");
  EXPECT_EQ(choice_name(Fruit::static_), "static");  // the trailing '_' is not spelled
  EXPECT_EQ(choices_of(Fruit{})[1].help, "green");
  EXPECT_EQ(choice_names<Fruit>(), "apple, pear or static");
  EXPECT_EQ(choice_names<Fruit>(", "), "apple, pear, static");
}

#define TEST_MIXES(X)                       \
  X(plain, "plain", "one fruit")            \
  X(apple_pear, "apple+pear", "two fruits") \
  X(static_, "static", "a keyword")
LOOM_CHOICE_SPELLED(Mix, "mix", TEST_MIXES)

TEST(Choice, SpelledListsNameEachChoiceInTheirSecondColumn) {
  EXPECT_EQ(choice_name(Mix::apple_pear), "apple+pear");
  EXPECT_EQ(choice_name(Mix::static_), "static");
  EXPECT_EQ(choices_of(Mix{})[1].help, "two fruits");
  EXPECT_EQ(parse_choice<Mix>("apple+pear"), Mix::apple_pear);
  EXPECT_EQ(parse_choice<Mix>("apple_pear"), std::nullopt);  // the enumerator is not a name
  EXPECT_EQ(choice_names<Mix>(), "plain, apple+pear or static");
}

TEST(Choice, ParsesEachNameBackAndNothingElse) {
  for (const ChoiceInfo& c : choices_of(Fruit{})) {
    const std::optional<Fruit> f = parse_choice<Fruit>(c.name);
    ASSERT_TRUE(f) << c.name;
    EXPECT_EQ(choice_name(*f), c.name);
  }
  EXPECT_EQ(parse_choice<Fruit>("static_"), std::nullopt);
  EXPECT_EQ(parse_choice<Fruit>("Apple"), std::nullopt);
  EXPECT_EQ(parse_choice<Fruit>(""), std::nullopt);
}

TEST(Choice, UnknownNameListsTheValidOnes) {
  try {
    parse_choice_or_throw<Fruit>("plum", "basket.fruit");
    ADD_FAILURE() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), "basket.fruit: unknown fruit 'plum'");
    EXPECT_EQ(e.hint(), "use apple, pear or static");
  }
}

TEST(ChoiceSet, ParsesNoneListsAndSpaces) {
  EXPECT_TRUE(parse_choice_set<Fruit>("").empty());
  EXPECT_TRUE(parse_choice_set<Fruit>("none").empty());
  const ChoiceSet<Fruit> s = parse_choice_set<Fruit>(" static , apple");
  EXPECT_TRUE(s.has(Fruit::apple));
  EXPECT_FALSE(s.has(Fruit::pear));
  EXPECT_TRUE(s.has(Fruit::static_));
  EXPECT_EQ(s, (ChoiceSet<Fruit>{Fruit::apple, Fruit::static_}));
  // Printed in declaration order, so equal sets print equal.
  EXPECT_EQ(choice_set_name(s), "apple,static");
  EXPECT_EQ(choice_set_name(ChoiceSet<Fruit>{}), "none");
  EXPECT_EQ(parse_choice_set<Fruit>(choice_set_name(s)), s);
}

TEST(ChoiceSet, UnknownMemberIsNamed) {
  for (const char* text : {"apple,plum", "apple,,pear"}) {
    try {
      parse_choice_set<Fruit>(text, "basket");
      ADD_FAILURE() << text << ": expected a UserError";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("unknown fruit"), std::string::npos) << e.what();
      EXPECT_EQ(e.hint(), "use none, or a comma-separated subset of apple, pear, static");
    }
  }
}

}  // namespace
}  // namespace loom
