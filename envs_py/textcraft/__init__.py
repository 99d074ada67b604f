"""TextCraft-Synth."""
