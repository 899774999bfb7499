"""How the user side answers: frozen, verbalized, trainable, population, rotation, self-play."""
