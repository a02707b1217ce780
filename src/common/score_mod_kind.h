// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// The score modifiers by kind (fusion/score_mod.h: one policy type per kind;
// the manifest's feature axis builds a unit per kind). Host and device.
#pragma once

namespace flash3 {

enum class ScoreModKind : int { kIdentity = 0, kSoftcap = 1 };
inline const char* score_mod_feature(ScoreModKind k) { return k == ScoreModKind::kSoftcap ? "softcap" : "none"; }

}  // namespace flash3
